import type { Sql } from '../db/index.js';
import { ApiError } from '../errors.js';
import type { Page } from '../http/query.js';
import { unitsToUsd } from './ledger.js';
import { teamsOf } from '../auth/membership.js';

// GET /api/v1/billing/wallet: the caller's wallet (or a team's, for members),
// its balance and its billings: charges summed per resource (a pod, a disk, a
// model used for inference, an RFT run), most recently billed first.


interface BillingRow {
  id: string;
  resource_type: string;
  resource_id: string;
  amount_units: number;
  created_at: Date;
  last_billed_at: Date;
}

export async function walletView(sql: Sql, userId: string, teamId: string | null, page: Page) {
  const [w] = teamId
    ? await sql<{ id: string; team_id: string | null; balance: number; currency: string }[]>`
        SELECT w.id, w.team_id, w.balance, w.currency FROM wallets w
        WHERE w.team_id = ${teamId} AND w.team_id IN (${teamsOf(sql, userId)})`
    : await sql<{ id: string; team_id: string | null; balance: number; currency: string }[]>`
        SELECT w.id, w.team_id, w.balance, w.currency FROM wallets w WHERE w.user_id = ${userId}`;
  // A team the caller is not in is answered like one that does not exist.
  if (!w) throw new ApiError('not_found', teamId ? `team ${JSON.stringify(teamId)} not found` : 'no wallet for this user', { param: teamId ? 'teamId' : undefined });
  const [count] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM billings WHERE wallet_id = ${w.id}`;
  const rows = await sql<BillingRow[]>`
    SELECT id, resource_type, resource_id, amount_units, created_at, last_billed_at FROM billings
    WHERE wallet_id = ${w.id} ORDER BY last_billed_at DESC, id LIMIT ${page.limit} OFFSET ${page.offset}`;
  return {
    wallet_id: w.id,
    team_id: w.team_id,
    balance_usd: unitsToUsd(w.balance),
    currency: w.currency,
    total_billings: count!.n,
    recent_billings: rows.map((b) => ({
      id: b.id,
      created_at: b.created_at.toISOString(),
      updated_at: b.last_billed_at.toISOString(),
      last_billed_at: b.last_billed_at.toISOString(),
      amount_usd: unitsToUsd(b.amount_units),
      currency: w.currency,
      resource_type: b.resource_type,
      resource_id: b.resource_id,
    })),
  };
}
