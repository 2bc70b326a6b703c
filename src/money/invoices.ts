import { randomBytes } from 'node:crypto';
import type { Sql, Tx } from '../db/index.js';
import { ApiError, conflict } from '../errors.js';
import { newId } from '../ids.js';
import { log } from '../log.js';
import { CHARGE_RESOURCE, CHARGE_TYPES, postTransaction, unitsToUsd } from './ledger.js';
import { iso } from '../format.js';

// Invoices: a statement of a wallet's charges over a period. Periods of one
// wallet follow each other without gap or overlap: each starts where the
// previous ended (the first at the wallet's creation) and is issued under the
// wallet's row lock. Every charge takes that lock before its ledger row gets
// its timestamp, so once the issuer holds it, every charge stamped before the
// period's end has committed: none is missed, none is invoiced twice.
//
// Issued (1) on demand by an admin, up to now, and (2) monthly: the invoicer
// checks every hour and invoices each wallet's charges up to the start of the
// current UTC month. Each invoice has a ledger row (type INVOICE, amount 0)
// carrying its external id (providerTransactionId) and its status, so VOID is
// recorded on its transaction. The external invoicing provider is simulated:
// ids are made here and voiding or paying needs no remote call.

/** How often the invoicer looks for closed months to invoice (and forgets old idempotency keys). */
export const INVOICER_INTERVAL_MS = 3_600_000;

interface InvoiceRow {
  id: string;
  wallet_id: string;
  provider_transaction_id: string;
  transaction_id: string;
  status: 'OPEN' | 'PAID' | 'VOID';
  amount_units: number;
  currency: string;
  period_start: Date;
  period_end: Date;
  lines: Array<{ resourceType: string; amountUnits: number; charges: number }>;
  created_at: Date;
  paid_at: Date | null;
  voided_at: Date | null;
}

function record(r: InvoiceRow) {
  return {
    id: r.id,
    walletId: r.wallet_id,
    providerTransactionId: r.provider_transaction_id,
    transactionId: r.transaction_id,
    status: r.status,
    amount: unitsToUsd(r.amount_units),
    currency: r.currency,
    periodStart: iso(r.period_start),
    periodEnd: iso(r.period_end),
    lines: r.lines.map((l) => ({ resourceType: l.resourceType, amount: unitsToUsd(l.amountUnits), charges: l.charges })),
    createdAt: iso(r.created_at),
    paidAt: iso(r.paid_at),
    voidedAt: iso(r.voided_at),
  };
}
export type Invoice = ReturnType<typeof record>;

const resourceOf = Object.entries(CHARGE_RESOURCE);

/**
 * Invoices the wallet's charges from the end of its last invoice up to `until`
 * (default: now). Answers null when there is nothing to invoice.
 */
export async function issueInvoice(sql: Sql, walletId: string, until?: Date): Promise<Invoice | null> {
  return sql.begin(async (tx) => {
    const [w] = await tx<{ created_at: Date; now: Date }[]>`
      SELECT created_at, clock_timestamp() AS now FROM wallets WHERE id = ${walletId} FOR UPDATE`;
    if (!w) throw new ApiError('not_found', `wallet ${JSON.stringify(walletId)} not found`, { param: 'wallet_id' });
    // The lock argument above needs the end not to lie ahead of the database's clock.
    const end = until && until < w.now ? until : w.now;
    const [last] = await tx<{ end: Date | null }[]>`SELECT max(period_end) AS end FROM invoices WHERE wallet_id = ${walletId}`;
    const start = last?.end ?? w.created_at;
    if (end <= start) return null;
    const lines = await tx<{ resource_type: string; amount_units: number; charges: number }[]>`
      SELECT m.resource_type, -sum(t.amount)::bigint AS amount_units, count(*)::int AS charges
      FROM wallet_transactions t
      JOIN unnest(${resourceOf.map(([t]) => t)}::text[], ${resourceOf.map(([, r]) => r)}::text[]) AS m(type, resource_type) ON m.type = t.type
      WHERE t.wallet_id = ${walletId} AND t.created_at >= ${start} AND t.created_at < ${end}
      GROUP BY 1 ORDER BY 1`;
    const total = lines.reduce((s, l) => s + l.amount_units, 0);
    if (total <= 0) return null;
    const id = newId();
    const external = `in_${randomBytes(12).toString('hex')}`;
    const posted = await postTransaction(tx, {
      walletId,
      amount: 0,
      type: 'INVOICE',
      description: `invoice ${external}: ${unitsToUsd(total)} USD of charges from ${start.toISOString()} to ${end.toISOString()}`,
      refType: 'invoice',
      refId: id,
      providerTransactionId: external,
      status: 'OPEN',
    });
    const [row] = await tx<InvoiceRow[]>`
      INSERT INTO invoices (id, wallet_id, provider_transaction_id, transaction_id, status, amount_units, period_start, period_end, lines)
      VALUES (${id}, ${walletId}, ${external}, ${posted.id}, 'OPEN', ${total}, ${start}, ${end},
              ${tx.json(lines.map((l) => ({ resourceType: l.resource_type, amountUnits: l.amount_units, charges: l.charges })))})
      RETURNING *`;
    return record(row!);
  });
}

export async function listInvoices(sql: Sql, walletId: string): Promise<Invoice[]> {
  const [w] = await sql`SELECT 1 FROM wallets WHERE id = ${walletId}`;
  if (!w) throw new ApiError('not_found', `wallet ${JSON.stringify(walletId)} not found`, { param: 'wallet_id' });
  const rows = await sql<InvoiceRow[]>`SELECT * FROM invoices WHERE wallet_id = ${walletId} ORDER BY period_end DESC`;
  return rows.map(record);
}

/** The invoice by its external id (or ours), locked; another wallet's invoice is 404 like an unknown one. */
async function lockInvoice(tx: Tx, walletId: string, invoiceId: string): Promise<InvoiceRow> {
  const [row] = await tx<InvoiceRow[]>`
    SELECT * FROM invoices WHERE (provider_transaction_id = ${invoiceId} OR id = ${invoiceId}) AND wallet_id = ${walletId} FOR UPDATE`;
  if (!row) throw new ApiError('not_found', `invoice ${JSON.stringify(invoiceId)} not found in wallet ${JSON.stringify(walletId)}`, { param: 'invoice_id' });
  return row;
}

/**
 * OPEN -> VOID (cancel) or OPEN -> PAID (the external provider reports
 * payment), on the invoice and on its ledger row; the balance does not move.
 * A PAID or VOID invoice is refused (409).
 */
async function settleInvoice(sql: Sql, walletId: string, invoiceId: string, to: 'VOID' | 'PAID'): Promise<Invoice> {
  return sql.begin(async (tx) => {
    const inv = await lockInvoice(tx, walletId, invoiceId);
    if (inv.status !== 'OPEN') {
      throw conflict(`invoice ${inv.provider_transaction_id} is ${inv.status}; only an OPEN invoice can be ${to === 'VOID' ? 'voided' : 'paid'}`, 'invoice_id');
    }
    const [row] = await tx<InvoiceRow[]>`
      UPDATE invoices SET status = ${to},
        voided_at = CASE WHEN ${to} = 'VOID' THEN clock_timestamp() ELSE voided_at END,
        paid_at = CASE WHEN ${to} = 'PAID' THEN clock_timestamp() ELSE paid_at END
      WHERE id = ${inv.id} RETURNING *`;
    await tx`UPDATE wallet_transactions SET status = ${to} WHERE id = ${inv.transaction_id}`;
    return record(row!);
  });
}

export const cancelInvoice = (sql: Sql, walletId: string, invoiceId: string) => settleInvoice(sql, walletId, invoiceId, 'VOID');
export const payInvoice = (sql: Sql, walletId: string, invoiceId: string) => settleInvoice(sql, walletId, invoiceId, 'PAID');

const monthStart = (now: Date) => new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1));

/** Invoices every wallet's uninvoiced charges before the start of `now`'s UTC month. */
export async function issueMonthly(sql: Sql, now: Date = new Date()): Promise<Invoice[]> {
  const until = monthStart(now);
  const due = await sql<{ id: string }[]>`
    SELECT w.id FROM wallets w
    WHERE EXISTS (
      SELECT 1 FROM wallet_transactions t
      WHERE t.wallet_id = w.id AND t.type = ANY(${CHARGE_TYPES}::text[]) AND t.created_at < ${until}
        AND t.created_at >= COALESCE((SELECT max(i.period_end) FROM invoices i WHERE i.wallet_id = w.id), w.created_at))`;
  const issued: Invoice[] = [];
  for (const { id } of due) {
    const inv = await issueInvoice(sql, id, until);
    if (inv) issued.push(inv);
  }
  if (issued.length) log.info({ invoices: issued.length, until }, 'monthly invoices issued');
  return issued;
}
