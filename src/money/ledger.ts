import { ApiError } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';

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
  | 'INVOICE'
  | 'VOID';

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
  const [w] = await tx<{ balance: number }[]>`
    UPDATE wallets SET balance = balance + ${p.amount} WHERE id = ${p.walletId} RETURNING balance`;
  if (!w) throw new ApiError('not_found', `wallet ${JSON.stringify(p.walletId)} not found`, { param: 'walletId' });
  const id = newId();
  const [row] = await tx<{ created_at: Date }[]>`
    INSERT INTO wallet_transactions (id, wallet_id, amount, balance_after, type, description, ref_type, ref_id, provider_transaction_id, status)
    VALUES (${id}, ${p.walletId}, ${p.amount}, ${w.balance}, ${p.type}, ${p.description ?? null}, ${p.refType ?? null},
            ${p.refId ?? null}, ${p.providerTransactionId ?? null}, ${p.status ?? null})
    RETURNING created_at`;
  return { id, walletId: p.walletId, amount: p.amount, balance: w.balance, type: p.type, createdAt: row!.created_at };
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
 * Starts billing a resource at `ratePerHrUsd` from `at` (state: PROVISIONING,
 * ACTIVE, STOPPED, ...). Closes the resource's open meter at the same instant
 * first, so a state change is pro-rated to the millisecond and never overlaps.
 */
export async function openMeter(
  tx: Tx,
  m: { walletId: string; resourceType: 'pod' | 'disk'; resourceId: string; state: string; ratePerHrUsd: number; at: Date },
): Promise<void> {
  await closeMeter(tx, m.resourceType, m.resourceId, m.at);
  await tx`
    INSERT INTO meters (id, wallet_id, resource_type, resource_id, state, rate_units_per_hr, started_at, metered_until)
    VALUES (${newId()}, ${m.walletId}, ${m.resourceType}, ${m.resourceId}, ${m.state}, ${usdToUnits(m.ratePerHrUsd)}, ${m.at}, ${m.at})`;
}

/** Stops billing a resource at `at` (termination). The meter loop charges what remains up to `at`. */
export async function closeMeter(tx: Tx, resourceType: 'pod' | 'disk', resourceId: string, at: Date): Promise<void> {
  await tx`
    UPDATE meters SET ended_at = GREATEST(${at}::timestamptz, started_at)
    WHERE resource_type = ${resourceType} AND resource_id = ${resourceId} AND ended_at IS NULL`;
}
