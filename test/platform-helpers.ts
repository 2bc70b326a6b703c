import fs from 'node:fs';
import path from 'node:path';
import postgres from 'postgres';
import { admin, call, daemon } from './helpers.js';

// Fixtures of the platform tests: a private corner of the inventory per test
// (its own provider, data center, nodes and offers, so parallel tests never
// share capacity), wallet funding, and polling helpers.

let seq = 0;
export const uniq = () => `${Date.now().toString(36)}${(seq++).toString(36)}${Math.random().toString(36).slice(2, 6)}`;

/** A connection to the embedded database of the daemon using `dataDir` (its port is in postmaster.pid). */
export function connectTo(dataDir: string): postgres.Sql {
  const pid = fs.readFileSync(path.join(dataDir, 'pg', 'postmaster.pid'), 'utf8').split('\n');
  return postgres(`postgres://cloudgate:cloudgate-local@127.0.0.1:${Number(pid[3])}/cloudgate`, { max: 2, onnotice: () => {} });
}

let db: postgres.Sql | undefined;
/** The shared daemon's database, for funding wallets and holding row locks. */
export function database(): postgres.Sql {
  return (db ??= connectTo(daemon().dataDir));
}

/**
 * Credits a wallet through the ledger (a TOPUP row and the balance in one
 * transaction, as the admin top-up does), so pod and disk tests do not depend
 * on the money routes.
 */
export async function fund(walletId: string, usd = 1000, sql: postgres.Sql = database()): Promise<void> {
  const units = Math.round(usd * 10_000);
  await sql.begin(async (tx) => {
    const [w] = await tx<{ balance: string }[]>`UPDATE wallets SET balance = balance + ${units} WHERE id = ${walletId} RETURNING balance`;
    await tx`INSERT INTO wallet_transactions (id, wallet_id, amount, balance_after, type, description)
             VALUES (gen_random_uuid()::text, ${walletId}, ${units}, ${w!.balance}, 'TOPUP', 'test funding')`;
  });
}

/** Sets a wallet's balance to exactly `units` (through a ledger row), e.g. zero for the 402 tests. */
export async function setBalance(walletId: string, units: number): Promise<void> {
  await database().begin(async (tx) => {
    const [w] = await tx<{ balance: string }[]>`SELECT balance FROM wallets WHERE id = ${walletId} FOR UPDATE`;
    const delta = units - Number(w!.balance);
    if (delta === 0) return;
    await tx`UPDATE wallets SET balance = ${units} WHERE id = ${walletId}`;
    await tx`INSERT INTO wallet_transactions (id, wallet_id, amount, balance_after, type, description)
             VALUES (gen_random_uuid()::text, ${walletId}, ${delta}, ${units}, ${delta > 0 ? 'TOPUP' : 'REFUND'}, 'test balance')`;
  });
}

/** Ledger rows of a wallet (for prepaid and history checks). */
export async function ledger(walletId: string) {
  return database()<{ amount: string; type: string; ref_type: string | null; ref_id: string | null }[]>`
    SELECT amount, type, ref_type, ref_id FROM wallet_transactions WHERE wallet_id = ${walletId} ORDER BY created_at`;
}

/** Meter rows of a resource, oldest first. */
export async function meters(resourceType: string, resourceId: string) {
  return database()<{ state: string; rate_units_per_hr: string; started_at: Date; ended_at: Date | null }[]>`
    SELECT state, rate_units_per_hr, started_at, ended_at FROM meters WHERE resource_type = ${resourceType} AND resource_id = ${resourceId}
    ORDER BY started_at, ended_at NULLS LAST`;
}

export async function closeDb(): Promise<void> {
  await db?.end({ timeout: 1 });
  db = undefined;
}

export const spec = (min: number | null, max: number | null, def: number | null, price: number | null, step: number | null, included: boolean | null) => ({
  minCount: min,
  maxCount: max,
  defaultCount: def,
  pricePerUnit: price,
  step,
  defaultIncludedInPrice: included,
});

export interface Place {
  provider: string;
  dc: string;
  contract: string;
  region: string;
  country: string;
  cloudId: string;
  gpuType: string;
  nodeIds: string[];
  diskOffer: string;
  /** A create-pod body for this place's offer with `gpuCount`. */
  body(over?: Record<string, unknown>, gpuCount?: number): any;
}

/**
 * A private provider with one data center, `nodes` nodes of `gpusPerNode`
 * GPUs, offers for 1 and 2 GPUs (prices chosen so every rule of SPEC 2.11 shows)
 * and a disk offer. `extra` overrides fields of the 1-GPU offer.
 */
export async function place(
  opts: { nodes?: number; gpusPerNode?: number; maxDisks?: number; extra?: Record<string, unknown>; multinode?: boolean; region?: string; diskCapacityGb?: number } = {},
): Promise<Place> {
  const u = uniq();
  const provider = `prov-${u}`;
  const dc = `DC-${u}`;
  const contract = `contract-${u}`;
  const region = opts.region ?? `region_${u}`;
  const gpuType = `TESTGPU_${u.toUpperCase()}`;
  const cloudId = `test-${u}`;
  const nodes = opts.nodes ?? 1;
  const gpus = opts.gpusPerNode ?? 1;
  const nodeIds = Array.from({ length: nodes }, (_, i) => `node-${u}-${i}`);
  const offer = (n: number) => ({
    id: `${provider}:${n}`,
    dataCenterId: dc,
    cloudId,
    gpuType,
    gpuCount: n,
    gpuMemory: 80,
    socket: 'SXM',
    security: 'secure_cloud',
    disk: spec(100, 1000, 200, 0.0001, 50, true),
    vcpu: spec(null, null, 16 * n, null, null, null),
    memory: spec(8, 128, 64, 0.002, 8, false),
    provisioningTime: 1,
    onDemand: 2 * n,
    images: ['img_a', 'img_b'],
    ...(n === 1 ? opts.extra : {}),
  });
  const r = await admin('POST', '/api/admin/inventory/import', {
    providers: [{ id: provider, name: `Provider ${u}`, maxDisksPerPod: opts.maxDisks ?? 2 }],
    dataCenters: [{ id: dc, providerId: provider, name: `DC ${u}`, region, country: 'US' }],
    contracts: [{ id: contract, providerId: provider, name: `Contract ${u}` }],
    nodes: nodeIds.map((id) => ({ id, dataCenterId: dc, contractId: contract, gpuType, gpuCount: gpus, gpuMemory: 80, socket: 'SXM', vcpus: 64 * gpus, memory: 512 * gpus, disk: 4000 * gpus })),
    gpuOffers: gpus >= 2 ? [offer(1), offer(2)] : [offer(1)],
    diskOffers: [{ id: `${provider}:disk`, dataCenterId: dc, cloudId: null, spec: spec(10, 500, 100, 0.0002, 10, false), security: 'secure_cloud', isMultinode: opts.multinode ?? false, capacityGb: opts.diskCapacityGb ?? 100_000 }],
  });
  if (r.status !== 200) throw new Error(`import: ${r.status} ${JSON.stringify(r.body)}`);
  return {
    provider,
    dc,
    contract,
    region,
    country: 'US',
    cloudId,
    gpuType,
    nodeIds,
    diskOffer: `${provider}:disk`,
    body: (over = {}, gpuCount = 1) => ({
      pod: { name: `pod-${u}`, cloudId, gpuType, socket: 'SXM', gpuCount, security: 'secure_cloud', image: 'img_a', dataCenterId: dc, country: 'US', ...over },
      provider: { type: provider },
    }),
  };
}

/** Polls `fn` until `done` holds or the deadline passes; answers the last value. */
export async function until<T>(fn: () => Promise<T>, done: (v: T) => boolean, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  let v = await fn();
  while (!done(v) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    v = await fn();
  }
  return v;
}

export const get = (key: string, p: string) => call('platform', 'GET', p, { key });
export const post = (key: string, p: string, body?: unknown) => call('platform', 'POST', p, { key, body });
export const del = (key: string, p: string) => call('platform', 'DELETE', p, { key });
