import fs from 'node:fs';
import path from 'node:path';
import { connect, type Sql } from '../src/db/index.js';
import { migrate } from '../src/db/migrate.js';
import { newId } from '../src/ids.js';
import { postTransaction } from '../src/money/ledger.js';
import { admin, call, daemon } from './helpers.js';

// Fixtures of the money tests: direct connections to the shared daemon's
// database (the same driver settings as the daemon: bigint as number), so a
// test can read the ledger, or run its own meter loop as a second daemon would.

/** The embedded database of the daemon using `dataDir` (its port is in postmaster.pid). */
export function dbUrl(dataDir: string = daemon().dataDir): string {
  const pid = fs.readFileSync(path.join(dataDir, 'pg', 'postmaster.pid'), 'utf8').split('\n');
  return `postgres://cloudgate:cloudgate-local@127.0.0.1:${Number(pid[3])}/cloudgate`;
}

export const openDb = (max = 4): Sql => connect(dbUrl(), max);

export async function topup(owner: { userId?: string; teamId?: string }, amount: number, type = 'TOPUP', headers: Record<string, string> = {}) {
  return call('platform', 'POST', '/api/admin/transactions/topup', { body: { ...owner, amount, type, description: `test ${type}` }, headers });
}

export async function ledgerOf(sql: Sql, walletId: string) {
  return sql<{ id: string; amount: number; balance_after: number; type: string; ref_type: string | null; ref_id: string | null; status: string | null; provider_transaction_id: string | null }[]>`
    SELECT id, amount, balance_after, type, ref_type, ref_id, status, provider_transaction_id
    FROM wallet_transactions WHERE wallet_id = ${walletId} ORDER BY created_at, id`;
}

/** Balance, ledger sum and whether the mismatch view lists the wallet. */
export async function conservation(sql: Sql, walletId: string) {
  const [w] = await sql<{ balance: number; total: number }[]>`
    SELECT w.balance, COALESCE((SELECT sum(amount) FROM wallet_transactions t WHERE t.wallet_id = w.id), 0)::bigint AS total
    FROM wallets w WHERE w.id = ${walletId}`;
  const bad = await sql`SELECT 1 FROM wallet_ledger_mismatches WHERE wallet_id = ${walletId}`;
  return { balance: w!.balance, ledger: w!.total, listedAsMismatch: bad.length > 0 };
}

export async function newRun(userId: string, pricing: Record<string, number>, teamId?: string) {
  const r = await admin('POST', '/api/admin/rft/runs', { name: `run-${Date.now()}`, baseModel: 'cloudgate/random-llama-chat', userId, teamId, pricing });
  if (r.status !== 201) throw new Error(`create run: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.data as { id: string; walletId: string };
}

/**
 * A database of its own on the shared daemon's server, migrated: meter tests
 * run their own meter loops at chosen instants there, where the daemon's own
 * loop (and the other tests' meters) cannot meet them.
 */
export async function isolatedDb(): Promise<{ url: string; sql: Sql; drop(): Promise<void> }> {
  const base = dbUrl();
  const server = connect(base.replace(/\/cloudgate$/, '/postgres'), 1);
  const name = `money_test_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  await server.unsafe(`CREATE DATABASE ${name}`);
  const url = base.replace(/\/cloudgate$/, `/${name}`);
  const sql = connect(url, 8);
  await migrate(sql);
  return {
    url,
    sql,
    drop: async () => {
      await sql.end({ timeout: 1 });
      await server.unsafe(`DROP DATABASE ${name} WITH (FORCE)`);
      await server.end({ timeout: 1 });
    },
  };
}

/** A user and wallet made directly in `sql`, funded with `units`. */
export async function walletIn(sql: Sql, units = 0): Promise<string> {
  const id = newId();
  const walletId = newId();
  await sql.begin(async (tx) => {
    await tx`INSERT INTO users (id, name, email) VALUES (${id}, ${'meter test'}, ${`${id}@test.local`})`;
    await tx`INSERT INTO wallets (id, user_id) VALUES (${walletId}, ${id})`;
    if (units) await postTransaction(tx, { walletId, amount: units, type: 'TOPUP' });
  });
  return walletId;
}
