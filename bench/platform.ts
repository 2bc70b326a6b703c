import fs from 'node:fs';
import path from 'node:path';
import postgres from 'postgres';
import { startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, fmt, load, machine, type Load } from './lib.js';

// Platform routes per second with the embedded database: GET /api/v1/pods (a
// user with a handful of pods) and POST /api/v1/pods (each request reserves
// capacity, opens a meter and inserts a pod), against the started daemon.
// Usage: node dist/bench/platform.js [--seconds 5] [--list-pods 10] [--connections 4,8,16,32,64] [--only list|create]

const args = benchArgs();
const seconds = Number(args.get('seconds') ?? 5);
const listPods = Number(args.get('list-pods') ?? 10);
/** Bench inventory: 8-GPU nodes, enough for every create of the run. */
const NODES = 2000;
const GPUS_PER_NODE = 8;
const CONNECTIONS = (args.get('connections') ?? '4,8,16,32,64').split(',').map(Number);
const only = args.get('only'); // 'list' or 'create' to run one half

async function main() {
  // Production timings (provider scale 1/60, meter every 10 s), not the test ones.
  const d = await startDaemon({ PROVIDER_TIME_SCALE: '0.0167', METER_INTERVAL_MS: '10000' });
  try {
    const h = { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' };
    const post = async (p: string, b: unknown) => {
      const r = await fetch(d.platformUrl + p, { method: 'POST', headers: h, body: JSON.stringify(b) });
      return { status: r.status, body: (await r.json()) as any };
    };
    const user = async (name: string) => {
      const u = (await post('/api/admin/users', { name, email: `${name}-${Date.now()}@bench.io` })).body.data;
      const k = (await post('/api/admin/api-keys', { userId: u.id, permissions: ['instances:write', 'availability:read'] })).body.data;
      await fund(d.dataDir, post, u.id, u.walletId);
      return { id: u.id as string, key: k.key as string };
    };
    // A private data center with NODES 8-GPU nodes and a 1-GPU offer (two imports: 1000 rows per call).
    const inv = { providers: [{ id: 'benchcloud', name: 'Bench', maxDisksPerPod: 1 }], dataCenters: [{ id: 'BENCH-1', providerId: 'benchcloud', name: 'Bench', region: 'bench', country: 'US' }], contracts: [{ id: 'bench-contract', providerId: 'benchcloud', name: 'Bench' }] };
    const node = (i: number) => ({ id: `bench-node-${i}`, dataCenterId: 'BENCH-1', contractId: 'bench-contract', gpuType: 'H100_80GB', gpuCount: GPUS_PER_NODE, gpuMemory: 80, socket: 'SXM', vcpus: 256, memory: 2048, disk: 30_000 });
    const offer = { id: 'bench-offer', dataCenterId: 'BENCH-1', cloudId: 'bench-h100', gpuType: 'H100_80GB', gpuCount: 1, gpuMemory: 80, socket: 'SXM', security: 'secure_cloud', disk: { minCount: 50, maxCount: 1000, defaultCount: 100, pricePerUnit: 0.0001, step: 10, defaultIncludedInPrice: true }, vcpu: { defaultCount: 24 }, memory: { defaultCount: 200 }, provisioningTime: 2, onDemand: 2.49, images: ['ubuntu_22_cuda_12'] };
    for (let start = 0; start < NODES; start += 1000) {
      const r = await post('/api/admin/inventory/import', { ...(start === 0 ? { ...inv, gpuOffers: [offer] } : {}), nodes: Array.from({ length: Math.min(1000, NODES - start) }, (_, i) => node(start + i)) });
      if (r.status !== 200) throw new Error(`import: ${r.status} ${JSON.stringify(r.body)}`);
    }
    const body = JSON.stringify({ pod: { name: 'bench', cloudId: 'bench-h100', gpuType: 'H100_80GB', socket: 'SXM', gpuCount: 1, dataCenterId: 'BENCH-1', country: 'US', image: 'ubuntu_22_cuda_12' }, provider: { type: 'benchcloud' } });

    const lister = await user('bench-list');
    const lh = { authorization: `Bearer ${lister.key}`, 'content-type': 'application/json' };
    for (let i = 0; i < listPods; i++) {
      const r = await fetch(`${d.platformUrl}/api/v1/pods`, { method: 'POST', headers: lh, body });
      if (r.status !== 200) throw new Error(`create: ${r.status} ${await r.text()}`);
    }
    const listUrl = `${d.platformUrl}/api/v1/pods`;
    const sample = await fetch(listUrl, { headers: lh });
    const listBytes = (await sample.text()).length;

    const creator = await user('bench-create');
    const ch = { authorization: `Bearer ${creator.key}`, 'content-type': 'application/json' };
    const createUrl = `${d.platformUrl}/api/v1/pods`;

    await load(listUrl, lh, 8, 1); // warm-up
    await load(createUrl, ch, 4, 1, { method: 'POST', body });
    const listRuns: Load[] = [];
    if (only !== 'create') for (const c of CONNECTIONS) listRuns.push(await load(listUrl, lh, c, seconds));
    const createRuns: Load[] = [];
    if (only !== 'list') for (const c of CONNECTIONS) createRuns.push(await load(createUrl, ch, c, seconds, { method: 'POST', body }));

    const created = await fetch(`${d.platformUrl}/api/v1/pods?limit=1`, { headers: ch }).then((r) => r.json() as Promise<any>);
    const best = (runs: Load[]) => runs.filter((r) => r.errors === 0 && r.non2xx === 0).reduce<Load | undefined>((a, b) => (!a || b.rps > a.rps ? b : a), undefined);
    const line = (r: Load) => `c=${r.connections}: ${fmt(r.rps)} req/s p50 ${r.p50} ms p99 ${r.p99} ms errors ${r.errors} non2xx ${r.non2xx}`;
    const bl = best(listRuns);
    const bc = best(createRuns);
    console.log(
      [
        `machine: ${machine()}`,
        `daemon: embedded PostgreSQL, PROVIDER_TIME_SCALE=0.0167, info logs (one line per request); ${seconds} s per run; autocannon on the same machine`,
        `GET /api/v1/pods (user with ${listPods} pods, ${listBytes} bytes per answer):`,
        ...listRuns.map((r) => `  ${line(r)}`),
        `POST /api/v1/pods (1 x H100 offer on ${NODES} nodes of ${GPUS_PER_NODE} GPUs; pods go ACTIVE 2 s later through the reconciler):`,
        ...createRuns.map((r) => `  ${line(r)}`),
        `  pods created by the create runs (total_count): ${created.total_count}`,
        `best: list ${fmt(bl?.rps ?? 0)} req/s (c=${bl?.connections}, p50 ${bl?.p50} ms, p99 ${bl?.p99} ms); create ${fmt(bc?.rps ?? 0)} req/s (c=${bc?.connections}, p50 ${bc?.p50} ms, p99 ${bc?.p99} ms)`,
      ].join('\n'),
    );
  } finally {
    await stopDaemon(d);
    fs.rmSync(d.dataDir, { recursive: true, force: true });
  }
}

/**
 * Funds a wallet: through the admin top-up when the money routes are there,
 * else straight into the ledger of the embedded database (same rows the top-up writes).
 */
async function fund(dataDir: string, post: (p: string, b: unknown) => Promise<{ status: number }>, userId: string, walletId: string) {
  const r = await post('/api/admin/transactions/topup', { userId, amount: 1_000_000 * 10_000, type: 'TOPUP', description: 'bench' });
  if (r.status === 200 || r.status === 201) return;
  const port = Number(fs.readFileSync(path.join(dataDir, 'pg', 'postmaster.pid'), 'utf8').split('\n')[3]);
  const sql = postgres(`postgres://cloudgate:cloudgate-local@127.0.0.1:${port}/cloudgate`, { max: 1, onnotice: () => {} });
  try {
    await sql.begin(async (tx) => {
      const [w] = await tx<{ balance: string }[]>`UPDATE wallets SET balance = balance + ${1_000_000 * 10_000} WHERE id = ${walletId} RETURNING balance`;
      await tx`INSERT INTO wallet_transactions (id, wallet_id, amount, balance_after, type, description)
               VALUES (gen_random_uuid()::text, ${walletId}, ${1_000_000 * 10_000}, ${w!.balance}, 'TOPUP', 'bench')`;
    });
  } finally {
    await sql.end();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
