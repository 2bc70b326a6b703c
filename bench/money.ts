import fs from 'node:fs';
import path from 'node:path';
import autocannon from 'autocannon';
import { connect } from '../src/db/index.js';
import { startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, fmt, machine } from './lib.js';

// Admin top-ups per second through the daemon (embedded PostgreSQL): on one
// wallet (every request queues on the same wallet row lock), on many wallets,
// and on many wallets with an Idempotency-Key per request. Afterwards the
// ledger is checked: one TOPUP row per 2xx answer, every balance = its ledger.
// Usage: node dist/bench/money.js [--seconds 5] [--wallets 500]

const args = benchArgs();
const seconds = Number(args.get('seconds') ?? 5);
const walletCount = Number(args.get('wallets') ?? 500);
const CONNECTIONS = [1, 4, 16, 64];

interface Row {
  scenario: string;
  connections: number;
  rps: number;
  p50: number;
  p99: number;
  ok: number;
  sent: number;
  other: number;
}

async function run(url: string, headers: Record<string, string>, connections: number, body: () => string, keyed: boolean): Promise<Omit<Row, 'scenario'>> {
  let n = 0;
  const r = await autocannon({
    url,
    connections,
    duration: seconds,
    requests: [
      {
        method: 'POST',
        setupRequest: (req: any) => ({
          ...req,
          headers: keyed ? { ...headers, 'idempotency-key': `bench-${process.pid}-${connections}-${n++}` } : headers,
          body: body(),
        }),
      },
    ],
  } as any);
  return { connections, rps: r.requests.average, p50: r.latency.p50, p99: r.latency.p99, ok: r['2xx'], sent: r.requests.sent, other: r.non2xx + r.errors + r.timeouts };
}

async function main() {
  const d = await startDaemon({ METER_INTERVAL_MS: '10000' });
  try {
    const h = { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' };
    const post = (p: string, b: unknown) => fetch(d.platformUrl + p, { method: 'POST', headers: h, body: JSON.stringify(b) }).then((r) => r.json() as Promise<any>);
    const users: string[] = [];
    for (let i = 0; i < walletCount; i += 50) {
      const batch = await Promise.all(
        Array.from({ length: Math.min(50, walletCount - i) }, (_, j) => post('/api/admin/users', { name: `bench ${i + j}`, email: `bench-${i + j}-${Date.now()}@bench.io` })),
      );
      users.push(...batch.map((u) => u.data.id as string));
    }
    const url = `${d.platformUrl}/api/admin/transactions/topup`;
    const one = JSON.stringify({ userId: users[0], amount: 10_000, type: 'TOPUP', description: 'bench' });
    let k = 0;
    const many = () => JSON.stringify({ userId: users[k++ % users.length], amount: 10_000, type: 'TOPUP', description: 'bench' });
    const warm = await run(url, h, 4, () => one, false);
    const rows: Row[] = [];
    for (const [scenario, body, keyed] of [
      ['one wallet', () => one, false],
      [`${walletCount} wallets`, many, false],
      [`${walletCount} wallets + Idempotency-Key`, many, true],
    ] as const) {
      for (const c of CONNECTIONS) rows.push({ scenario, ...(await run(url, h, c, body, keyed)) });
    }

    // The embedded server's port is in its pid file (line 4).
    const port = Number(fs.readFileSync(path.join(d.dataDir, 'pg', 'postmaster.pid'), 'utf8').split('\n')[3]);
    const sql = connect(`postgres://cloudgate:cloudgate-local@127.0.0.1:${port}/cloudgate`, 2);
    const [topups] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM wallet_transactions WHERE type = 'TOPUP' AND description = 'bench'`;
    const [bad] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM wallet_ledger_mismatches`;
    await sql.end({ timeout: 1 });
    // autocannon stops at the deadline without counting answers still in flight, so the
    // ledger must hold at least the 2xx answers counted and at most the requests sent.
    const answered = warm.ok + rows.reduce((s, r) => s + r.ok, 0);
    const sent = warm.sent + rows.reduce((s, r) => s + r.sent, 0);

    const lines = [
      `machine: ${machine()}`,
      `POST /api/admin/transactions/topup, ${seconds} s per run, embedded PostgreSQL, info logs`,
      '| scenario | connections | top-ups/s | p50 ms | p99 ms | non-2xx |',
      '| --- | --- | --- | --- | --- | --- |',
      ...rows.map((r) => `| ${r.scenario} | ${r.connections} | ${fmt(r.rps)} | ${r.p50} | ${r.p99} | ${r.other} |`),
      `ledger check: ${topups!.n} bench TOPUP rows, between the ${answered} 2xx answers counted and the ${sent} requests sent: ${answered <= topups!.n && topups!.n <= sent ? 'ok' : 'MISMATCH'}; wallets whose balance differs from their ledger: ${bad!.n}`,
    ];
    console.log(lines.join('\n'));
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
