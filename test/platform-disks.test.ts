import { afterAll, describe, expect, it } from 'vitest';
import { addMember, admin, call, newTeam, newUser } from './helpers.js';
import { closeDb, del, fund, get, meters, place, post, until } from './platform-helpers.js';

afterAll(closeDb);

const RW = ['disks:write', 'instances:write', 'availability:read'];

async function funded() {
  const u = await newUser(RW);
  await fund(u.walletId);
  return u;
}

const body = (p: { provider: string; dc: string }, disk: Record<string, unknown> = {}) => ({ disk: { size: 50, dataCenterId: p.dc, ...disk }, provider: { type: p.provider } });
const patch = (key: string, path: string, b: unknown) => call('platform', 'PATCH', path, { key, body: b });

describe('disk create', () => {
  it('answers 201 with the disk record in PROVISIONING, then ACTIVE; priceHr is size x price per GB', async () => {
    const u = await funded();
    const p = await place();
    const r = await post(u.key, '/api/v1/disks/', body(p, { name: 'scratch' }));
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({
      name: 'scratch',
      status: 'PROVISIONING',
      providerType: p.provider,
      size: 50,
      info: { cloudId: null, country: 'US', isMultinode: false, dataCenterId: p.dc },
      priceHr: 0.01,
      stoppedPriceHr: 0.01,
      provisioningPriceHr: 0.01,
      userId: u.userId,
      teamId: null,
      walletId: u.walletId,
      pods: [],
      clusters: [],
      terminatedAt: null,
    });
    expect(typeof r.body.createdAt).toBe('string');
    const ready = await until(() => get(u.key, `/api/v1/disks/${r.body.id}`), (x) => x.body.status === 'ACTIVE');
    expect(ready.body.status).toBe('ACTIVE');
    const m = await meters('disk', r.body.id);
    expect(m.map((x) => [x.state, Number(x.rate_units_per_hr)])).toEqual([
      ['PROVISIONING', 100],
      ['ACTIVE', 100],
    ]);
    expect(m[0]!.started_at.toISOString()).toBe(r.body.createdAt);
    const unnamed = await post(u.key, '/api/v1/disks', body(p));
    expect(unnamed.body.name).toMatch(/^disk-[0-9a-f]{8}$/);
  });

  it('validates size between minCount and maxCount in steps, and the offer fields (boundary accepted, one past refused)', async () => {
    const u = await funded();
    const p = await place();
    for (const size of [10, 500, 20]) expect((await post(u.key, '/api/v1/disks', body(p, { size }))).status, String(size)).toBe(201);
    for (const size of [9, 501, 15, 1.5, 0, '10']) {
      const r = await post(u.key, '/api/v1/disks', body(p, { size }));
      expect(r.status, String(size)).toBe(422);
      expect(r.body.errors[0].param).toBe('disk.size');
    }
    const noDc = await post(u.key, '/api/v1/disks', body(p, { dataCenterId: null }));
    expect(noDc.status).toBe(422);
    expect(noDc.body.errors[0].param).toBe('disk.dataCenterId');
    expect((await post(u.key, '/api/v1/disks', body(p, { dataCenterId: 'nowhere' }))).body.errors[0].param).toBe('disk.dataCenterId');
    expect((await post(u.key, '/api/v1/disks', body(p, { cloudId: 'nope' }))).body.errors[0].param).toBe('disk.cloudId');
    expect((await post(u.key, '/api/v1/disks', { ...body(p), provider: { type: 'no-such-provider' } })).body.errors[0].param).toBe('provider.type');
    expect((await post(u.key, '/api/v1/disks', { disk: { size: 10 } })).body.errors[0].param).toBe('provider');
    // A seeded offer with a cloudId requires it.
    const seeded = await post(u.key, '/api/v1/disks', { disk: { size: 100, dataCenterId: 'US-1' }, provider: { type: 'hyperstack' } });
    expect(seeded.status).toBe(422);
    expect(seeded.body.errors[0].param).toBe('disk.cloudId');
    const withCloud = await post(u.key, '/api/v1/disks', { disk: { size: 100, dataCenterId: 'US-1', cloudId: 'hyperstack-shared-storage' }, provider: { type: 'hyperstack' } });
    expect(withCloud.status).toBe(201);
    expect(withCloud.body.info).toMatchObject({ cloudId: 'hyperstack-shared-storage', isMultinode: true, dataCenterId: 'US-1' });
  });

  it('takes storage from the offer pool (409 when it is short) and gives it back on delete', async () => {
    const u = await funded();
    const p = await place({ diskCapacityGb: 100 });
    const a = await post(u.key, '/api/v1/disks', body(p, { size: 60 }));
    expect(a.status).toBe(201);
    const short = await post(u.key, '/api/v1/disks', body(p, { size: 50 }));
    expect(short.status).toBe(409);
    expect(short.body.errors[0].details).toContain('not enough free storage');
    await until(() => get(u.key, `/api/v1/disks/${a.body.id}`), (x) => x.body.status === 'ACTIVE');
    expect((await del(u.key, `/api/v1/disks/${a.body.id}`)).status).toBe(200);
    expect((await post(u.key, '/api/v1/disks', body(p, { size: 50 }))).status).toBe(201);
  });

  it('bills a team disk to the team wallet; refuses non-members (403) and empty wallets (402)', async () => {
    const u = await funded();
    const team = await newTeam();
    await addMember(team.id, u.userId);
    const p = await place();
    expect((await post(u.key, '/api/v1/disks', { ...body(p), team: { teamId: team.id } })).status).toBe(402);
    await fund(team.walletId);
    const r = await post(u.key, '/api/v1/disks', { ...body(p), team: { teamId: team.id } });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ teamId: team.id, walletId: team.walletId });
    const outsider = await funded();
    expect((await post(outsider.key, '/api/v1/disks', { ...body(p), team: { teamId: team.id } })).status).toBe(403);
    // Team disks are visible to the team's members.
    const mate = await newUser(['disks:read']);
    await addMember(team.id, mate.userId);
    expect((await get(mate.key, `/api/v1/disks/${r.body.id}`)).status).toBe(200);
    expect((await get(outsider.key, `/api/v1/disks/${r.body.id}`)).status).toBe(404);
    const broke = await newUser(RW);
    const no = await post(broke.key, '/api/v1/disks', body(p));
    expect(no.status).toBe(402);
    expect(no.body.errors[0].details).toContain('a disk');
  });
});

describe('disk list, get, rename, delete', () => {
  it('lists live disks newest first with limit (default 50, max 200), offset, totalCount and total_count', async () => {
    const u = await funded();
    const p = await place();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await post(u.key, '/api/v1/disks', body(p))).body.id);
    const r = await get(u.key, '/api/v1/disks');
    expect(r.body).toMatchObject({ totalCount: 3, total_count: 3, limit: 50, offset: 0 });
    expect(r.body.data.map((d: any) => d.id)).toEqual([...ids].reverse());
    const page = await get(u.key, '/api/v1/disks?limit=1&offset=2');
    expect(page.body).toMatchObject({ totalCount: 3, total_count: 3, limit: 1, offset: 2 });
    expect(page.body.data[0].id).toBe(ids[0]);
    expect((await get(u.key, '/api/v1/disks?limit=200')).status).toBe(200);
    for (const qs of ['limit=201', 'limit=0', 'offset=-1']) expect((await get(u.key, `/api/v1/disks?${qs}`)).status, qs).toBe(422);
    const other = await newUser(['disks:read']);
    expect((await get(other.key, '/api/v1/disks')).body).toMatchObject({ totalCount: 0, data: [] });
    expect((await get(other.key, `/api/v1/disks/${ids[0]}`)).status).toBe(404);
  });

  it('renames by PATCH of the name only; any other key is refused', async () => {
    const u = await funded();
    const p = await place();
    const d = (await post(u.key, '/api/v1/disks', body(p))).body;
    const r = await patch(u.key, `/api/v1/disks/${d.id}`, { name: 'renamed' });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ id: d.id, name: 'renamed' });
    expect((await get(u.key, `/api/v1/disks/${d.id}`)).body.name).toBe('renamed');
    for (const b of [{ size: 100 }, { name: 'x', size: 100 }, { name: '' }, { name: 'x'.repeat(256) }, {}]) {
      const bad = await patch(u.key, `/api/v1/disks/${d.id}`, b);
      expect(bad.status, JSON.stringify(b)).toBe(422);
    }
    expect((await get(u.key, `/api/v1/disks/${d.id}`)).body.size).toBe(50);
    const other = await newUser(['disks:write']);
    expect((await patch(other.key, `/api/v1/disks/${d.id}`, { name: 'mine' })).status).toBe(404);
    const readOnly = await newUser(['disks:read']);
    expect((await patch(readOnly.key, `/api/v1/disks/${d.id}`, { name: 'mine' })).status).toBe(403);
  });

  it('deletes an ACTIVE disk to TERMINATED, keeps the row, closes billing; a second delete is 409', async () => {
    const u = await funded();
    const p = await place();
    const d = (await post(u.key, '/api/v1/disks', body(p))).body;
    await until(() => get(u.key, `/api/v1/disks/${d.id}`), (x) => x.body.status === 'ACTIVE');
    const other = await newUser(['disks:write']);
    expect((await del(other.key, `/api/v1/disks/${d.id}`)).status).toBe(404);
    const r = await del(u.key, `/api/v1/disks/${d.id}`);
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ status: 'TERMINATED' });
    const kept = await get(u.key, `/api/v1/disks/${d.id}`);
    expect(kept.body).toMatchObject({ id: d.id, status: 'TERMINATED' });
    expect(typeof kept.body.terminatedAt).toBe('string');
    expect((await get(u.key, '/api/v1/disks')).body.totalCount).toBe(0);
    const m = await meters('disk', d.id);
    expect(m.every((x) => x.ended_at !== null)).toBe(true);
    expect(m.at(-1)!.ended_at!.toISOString()).toBe(kept.body.terminatedAt);
    expect((await del(u.key, `/api/v1/disks/${d.id}`)).status).toBe(409);
  });

  it('names the clusters of the pods using a disk', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 2 });
    const cluster = `cluster-${p.dc}`;
    const imp = await admin('POST', '/api/admin/inventory/import', {
      clusters: [{ id: cluster, name: 'c', dataCenterId: p.dc }],
      assignments: [{ id: `a-${p.dc}`, nodeId: p.nodeIds[0], clusterId: cluster, status: 'ACTIVE' }],
    });
    expect(imp.status).toBe(200);
    const d = (await post(u.key, '/api/v1/disks', body(p))).body;
    await until(() => get(u.key, `/api/v1/disks/${d.id}`), (x) => x.body.status === 'ACTIVE');
    const pod = await post(u.key, '/api/v1/pods', { ...p.body(), disks: [d.id] });
    expect(pod.body.clusterId).toBe(cluster);
    const disk = await get(u.key, `/api/v1/disks/${d.id}`);
    expect(disk.body).toMatchObject({ pods: [pod.body.id], clusters: [cluster] });
  });
});
