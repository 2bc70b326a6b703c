import { ApiError } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';
import { counter } from '../metrics.js';
import type { CHARGE_RESOURCES } from './protocol.js';

// The only code that changes a balance. Each change locks the wallet row,
// updates the balance and appends its ledger row in the caller's transaction,
// so balance = sum(ledger) holds at every commit.

/** Stored money: USD x 10000 (SPEC 2.11 rule 7). */
export const UNITS_PER_USD = 10_000;
export const usdToUnits = (usd: number): number => Math.round(usd * UNITS_PER_USD);
export const unitsToUsd = (units: number): number => units / UNITS_PER_USD;

export type TransactionType =
  | 'TOPUP'
  | 'REFUND'
  | 'POD_CHARGE'
  | 'DISK_CHARGE'
  | 'PREPAID_CHARGE'
  | 'INFERENCE_CHARGE'
  | 'TRAINING_CHARGE'
  | 'INVOICE'
  | 'VOID';

/**
 * Charge types and the billing resource type each is summed under
 * (`GET /api/v1/billing/wallet`, invoices). Charges are posted negative.
 */
export const CHARGE_RESOURCE: Partial<Record<TransactionType, (typeof CHARGE_RESOURCES)[number]>> = {
  POD_CHARGE: 'compute',
  PREPAID_CHARGE: 'compute',
  DISK_CHARGE: 'disks',
  INFERENCE_CHARGE: 'inference',
  TRAINING_CHARGE: 'training',
};
export const CHARGE_TYPES = Object.keys(CHARGE_RESOURCE) as TransactionType[];

export interface PostInput {
  walletId: string;
  /** Signed units: credits positive, debits negative. */
  amount: number;
  type: TransactionType;
  description?: string | null;
  refType?: string | null;
  refId?: string | null;
  providerTransactionId?: string | null;
  status?: string | null;
}

export interface Posted {
  id: string;
  walletId: string;
  amount: number;
  balance: number;
  type: TransactionType;
  createdAt: Date;
}

export async function postTransaction(tx: Tx, p: PostInput): Promise<Posted> {
  if (!Number.isSafeInteger(p.amount)) throw new Error(`ledger amount must be a safe integer, got ${p.amount}`);
  const id = newId();
  const resourceType = CHARGE_RESOURCE[p.type];
  // One statement, one round trip: the balance update (which row-locks the
  // wallet), its ledger row, and for a charge its billing summary.
  const billing =
    resourceType && p.refId
      ? tx`, b AS (
          INSERT INTO billings (id, wallet_id, resource_type, resource_id, amount_units, charges, created_at, last_billed_at)
          SELECT ${newId()}, ${p.walletId}, ${resourceType}, ${p.refId}, ${-p.amount}, 1, t.created_at, t.created_at FROM t
          ON CONFLICT (wallet_id, resource_type, resource_id) DO UPDATE
            SET amount_units = billings.amount_units + EXCLUDED.amount_units, charges = billings.charges + 1,
                last_billed_at = EXCLUDED.last_billed_at)`
      : tx``;
  const [row] = await tx<{ balance_after: number; created_at: Date }[]>`
    WITH w AS (UPDATE wallets SET balance = balance + ${p.amount} WHERE id = ${p.walletId} RETURNING balance),
    t AS (
      INSERT INTO wallet_transactions (id, wallet_id, amount, balance_after, type, description, ref_type, ref_id, provider_transaction_id, status)
      SELECT ${id}, ${p.walletId}, ${p.amount}, w.balance, ${p.type}, ${p.description ?? null}, ${p.refType ?? null},
             ${p.refId ?? null}, ${p.providerTransactionId ?? null}, ${p.status ?? null}
      FROM w
      RETURNING balance_after, created_at)
    ${billing}
    SELECT balance_after, created_at FROM t`;
  if (!row) throw new ApiError('not_found', `wallet ${JSON.stringify(p.walletId)} not found`, { param: 'walletId' });
  return { id, walletId: p.walletId, amount: p.amount, balance: row.balance_after, type: p.type, createdAt: row.created_at };
}

export async function balanceOf(sql: Sql | Tx, walletId: string): Promise<number> {
  const [w] = await sql<{ balance: number }[]>`SELECT balance FROM wallets WHERE id = ${walletId}`;
  if (!w) throw new ApiError('not_found', `wallet ${JSON.stringify(walletId)} not found`, { param: 'walletId' });
  return w.balance;
}

/** 402 for a wallet at or below zero: nothing new is started on credit. */
export async function requireFunded(sql: Sql | Tx, walletId: string, what: string): Promise<void> {
  const balance = await balanceOf(sql, walletId);
  if (balance <= 0) {
    throw new ApiError(
      'payment_required',
      `wallet ${walletId} has a balance of ${unitsToUsd(balance).toFixed(4)} USD; top it up before creating ${what}`,
      { param: 'walletId', code: 'insufficient_quota' },
    );
  }
}

export async function walletOf(sql: Sql | Tx, owner: { userId?: string | null; teamId?: string | null }): Promise<string> {
  const rows = owner.teamId
    ? await sql<{ id: string }[]>`SELECT id FROM wallets WHERE team_id = ${owner.teamId}`
    : await sql<{ id: string }[]>`SELECT id FROM wallets WHERE user_id = ${owner.userId ?? ''}`;
  if (!rows[0]) throw new ApiError('not_found', 'wallet not found for this owner');
  return rows[0].id;
}

/**
 * Starts billing a resource at `rateUnitsPerHr` (units per hour, as stored) from `at` (state: PROVISIONING,
 * ACTIVE, STOPPED, ...). Closes the resource's open meter at the same instant
 * first, so a state change is pro-rated to the millisecond and never overlaps.
 */
export async function openMeter(
  tx: Tx,
  m: { walletId: string; resourceType: 'pod' | 'disk'; resourceId: string; state: string; rateUnitsPerHr: number; at: Date },
): Promise<void> {
  await closeMeter(tx, m.resourceType, m.resourceId, m.at);
  await tx`
    INSERT INTO meters (id, wallet_id, resource_type, resource_id, state, rate_units_per_hr, started_at, metered_until)
    VALUES (${newId()}, ${m.walletId}, ${m.resourceType}, ${m.resourceId}, ${m.state}, ${m.rateUnitsPerHr}, ${m.at}, ${m.at})`;
}

/**
 * Stops billing a resource at `at` (termination). What remains up to `at` is
 * charged at once when the wallet row is free; when another transaction holds
 * it, the meter loop charges it within one interval (never waiting here, so a
 * caller holding other locks cannot deadlock on the wallet).
 */
export async function closeMeter(tx: Tx, resourceType: 'pod' | 'disk', resourceId: string, at: Date): Promise<void> {
  const closed = await tx<{ id: string; wallet_id: string }[]>`
    UPDATE meters SET ended_at = GREATEST(${at}::timestamptz, started_at)
    WHERE resource_type = ${resourceType} AND resource_id = ${resourceId} AND ended_at IS NULL
    RETURNING id, wallet_id`;
  for (const m of closed) {
    const [free] = await tx`SELECT 1 FROM wallets WHERE id = ${m.wallet_id} FOR UPDATE SKIP LOCKED`;
    if (free) await settleMeters(tx, { meterIds: [m.id] }, at);
  }
}

export interface MeterCharge {
  walletId: string;
  resourceType: string;
  units: number;
}

/** Metered charges, in units, as they are posted (corrections not subtracted; a rolled-back transaction may have counted). */
export const meterCharged = counter({
  name: 'meter_charged_units_total',
  help: 'Pod and disk charges posted by metering, in units of USD x 10000',
  labelNames: ['resource_type'],
}, 'platform');

/**
 * Charges meters up to `upto` (never past their end): each meter's ledger total
 * becomes floor(rate x (min(upto, ended_at) - started_at) / 1 h), and the
 * difference to what it already holds (charged_units) is posted, with
 * charged_units and metered_until moved in the same transaction. The target is
 * a function of time only, so running this twice, in two daemons or after a
 * restart, charges nothing twice. `meterIds` must already be locked by the
 * caller; with `walletIds` the caller holds those wallet rows and meters
 * another transaction holds are skipped (charged next time).
 */
export async function settleMeters(tx: Tx, which: { meterIds: string[] } | { walletIds: string[] }, upto: Date): Promise<MeterCharge[]> {
  const filter =
    'meterIds' in which
      ? tx`id = ANY(${which.meterIds}::text[]) FOR UPDATE`
      : tx`wallet_id = ANY(${which.walletIds}::text[]) AND (ended_at IS NULL OR metered_until < ended_at) AND metered_until < ${upto}
           ORDER BY wallet_id, id FOR UPDATE SKIP LOCKED`;
  const rows = await tx<{ id: string; wallet_id: string; resource_type: string; resource_id: string; state: string; rate_units_per_hr: number; charged_units: number; target: number; until: Date; final: boolean }[]>`
    SELECT id, wallet_id, resource_type, resource_id, state, rate_units_per_hr, charged_units,
           GREATEST(0, floor(rate_units_per_hr::numeric
             * extract(epoch FROM (LEAST(COALESCE(ended_at, ${upto}), ${upto}::timestamptz) - started_at)) / 3600))::bigint AS target,
           LEAST(COALESCE(ended_at, ${upto}), ${upto}::timestamptz) AS until,
           COALESCE(ended_at <= ${upto}, false) AS final
    FROM meters WHERE ${filter}`;
  if (!rows.length) return [];
  const charges: MeterCharge[] = [];
  const charged: number[] = [];
  for (const m of rows) {
    // An open meter only grows (a daemon with a slower clock posts nothing). A
    // closed one is settled to its exact total: if it was charged past its end
    // (its close waited on a meter run that had already charged a few ms
    // further), the excess goes back to the wallet.
    const next = m.final ? m.target : Math.max(m.target, m.charged_units);
    charged.push(next);
    const units = next - m.charged_units;
    if (units === 0) continue;
    await postTransaction(tx, {
      walletId: m.wallet_id,
      amount: -units,
      type: m.resource_type === 'disk' ? 'DISK_CHARGE' : 'POD_CHARGE',
      description: `${units < 0 ? 'correction: ' : ''}${m.resource_type} ${m.resource_id} ${m.state} at ${unitsToUsd(m.rate_units_per_hr)} USD/hr`,
      refType: m.resource_type,
      refId: m.resource_id,
    });
    charges.push({ walletId: m.wallet_id, resourceType: m.resource_type, units });
    if (units > 0) meterCharged.inc({ resource_type: m.resource_type }, units);
  }
  await tx`
    UPDATE meters m SET charged_units = v.charged, metered_until = GREATEST(m.metered_until, v.until)
    FROM unnest(${rows.map((r) => r.id)}::text[], ${charged}::bigint[], ${rows.map((r) => r.until.toISOString())}::timestamptz[])
         AS v(id, charged, until)
    WHERE m.id = v.id`;
  return charges;
}
