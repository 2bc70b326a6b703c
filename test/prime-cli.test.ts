import { afterAll, describe, expect, it } from 'vitest';
import { addMember, admin, call, newTeam, newUser } from './helpers.js';
import { closeDb, fund, get, place, post } from './platform-helpers.js';

// The calls Prime's CLI (PrimeIntellect-ai/prime, packages/prime and prime-evals)
// makes that the rest of the suite does not: shapes as its pydantic models and
// commands read them.

afterAll(closeDb);

const put = (key: string, path: string, body: unknown) => call('platform', 'PUT', path, { key, body });

describe('GET /api/v1/user/whoami', () => {
  it('answers {data: {id, email, name, slug, scope}} for any valid key, scope rows by area', async () => {
    const u = await newUser(['instances:write', 'evaluations:read', 'inference:use']);
    const r = await get(u.key, '/api/v1/user/whoami');
    expect(r.status).toBe(200);
    expect(r.body.data).toMatchObject({ id: u.userId, slug: null, apiKeyId: u.keyId });
    expect(r.body.data.email).toMatch(/@test\.local$/);
    expect(r.body.data.name).toMatch(/^user /);
    expect(r.body.data.scope).toMatchObject({
      instances: { read: true, write: true }, // write includes read
      evaluations: { read: true, write: false },
      disks: { read: false, write: false },
      inference: { read: true, write: true },
      admin: { read: false, write: false },
    });
    expect(JSON.stringify(r.body)).not.toContain(u.key);
    expect((await call('platform', 'GET', '/api/v1/user/whoami', { key: 'cg_nope' })).status).toBe(401);
  });
});

describe('PUT /api/v1/evaluations/{id}', () => {
  it("replaces the fields prime-evals' update_evaluation sends, keeps the others, refuses unknown keys and strangers", async () => {
    const u = await newUser(['evaluations:write']);
    const created = await post(u.key, '/api/v1/evaluations', { name: 'first', model_name: 'm1', tags: ['a', 'b'], metadata: { k: 1 }, dataset: 'gsm8k' });
    expect(created.status).toBe(201);
    const id = created.body.id;
    // What update_evaluation(id, name=..., metrics=...) puts on the wire: Nones dropped, tags always sent.
    const r = await put(u.key, `/api/v1/evaluations/${id}`, { name: 'renamed', metrics: { accuracy: 0.75 }, tags: [] });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ id, name: 'renamed', metrics: { accuracy: 0.75 }, tags: [], model_name: 'm1', dataset: 'gsm8k', metadata: { k: 1 }, status: 'PENDING' });
    expect(Date.parse(r.body.updated_at)).toBeGreaterThanOrEqual(Date.parse(created.body.updated_at));
    const again = await get(u.key, `/api/v1/evaluations/${id}`);
    expect(again.body).toMatchObject({ name: 'renamed', tags: [], metadata: { k: 1 } });
    const meta = await put(u.key, `/api/v1/evaluations/${id}`, { metadata: { k: 2 }, description: 'd', framework: 'verifiers', task_type: 'qa', tags: ['x'] });
    expect(meta.body).toMatchObject({ name: 'renamed', metadata: { k: 2 }, description: 'd', framework: 'verifiers', task_type: 'qa', tags: ['x'] });

    const unknown = await put(u.key, `/api/v1/evaluations/${id}`, { status: 'COMPLETED' });
    expect(unknown.status).toBe(422);
    expect(JSON.stringify(unknown.body)).toContain('status');
    const empty = await put(u.key, `/api/v1/evaluations/${id}`, { name: '' });
    expect(empty.status).toBe(422);
    expect(empty.body.errors[0].param).toBe('name');
    const stranger = await newUser(['evaluations:write']);
    expect((await put(stranger.key, `/api/v1/evaluations/${id}`, { name: 'x' })).status).toBe(404);
    const reader = await newUser(['evaluations:read']);
    expect((await put(reader.key, `/api/v1/evaluations/${id}`, { name: 'x' })).status).toBe(403);
    expect((await put(u.key, '/api/v1/evaluations/nope', { name: 'x' })).status).toBe(404);
  });

  it("lets a team member update the team's record", async () => {
    const owner = await newUser(['evaluations:write']);
    const mate = await newUser(['evaluations:write']);
    const team = await newTeam();
    await addMember(team.id, owner.userId);
    await addMember(team.id, mate.userId);
    const e = (await post(owner.key, '/api/v1/evaluations', { name: 'team run', team_id: team.id })).body;
    const r = await put(mate.key, `/api/v1/evaluations/${e.id}`, { name: 'renamed by mate', tags: [] });
    expect(r.status).toBe(200);
    expect(r.body.name).toBe('renamed by mate');
  });
});

describe('GET /api/v1/availability/multi-node', () => {
  it("lists a cluster whose nodes are all ACTIVE and free as one GPU offer, paged like /gpus; a busy node takes it off", async () => {
    const u = await newUser(['availability:read', 'instances:write']);
    const p = await place({ nodes: 2, gpusPerNode: 2 });
    const cluster = `cl-${p.dc}`;
    const imp = await admin('POST', '/api/admin/inventory/import', {
      clusters: [{ id: cluster, name: 'c', dataCenterId: p.dc }],
      assignments: p.nodeIds.map((n) => ({ id: `${cluster}-${n}`, nodeId: n, clusterId: cluster, status: 'ACTIVE' })),
    });
    expect(imp.status).toBe(200);
    const q = `/api/v1/availability/multi-node?gpu_type=${p.gpuType}&page=1&page_size=100`;
    const r = await get(u.key, q);
    expect(r.status).toBe(200);
    expect(r.body.totalCount).toBe(1);
    // The whole-node offer (2 GPUs at 4 USD/h) times two nodes.
    expect(r.body.items[0]).toMatchObject({
      cloudId: cluster, gpuType: p.gpuType, gpuCount: 4, gpuMemory: 80, socket: 'SXM', provider: p.provider, dataCenter: p.dc, region: p.region, country: 'US',
      prices: { onDemand: 8, currency: 'USD' }, security: 'secure_cloud',
    });
    // Every key the CLI's GPUAvailability model requires.
    for (const k of ['cloudId', 'gpuType', 'gpuCount', 'gpuMemory', 'disk', 'vcpu', 'memory', 'stockStatus', 'prices']) expect(r.body.items[0]).toHaveProperty(k);
    expect((await get(u.key, `${q}&gpu_count=4`)).body.totalCount).toBe(1);
    expect((await get(u.key, `${q}&gpu_count=2`)).body.totalCount).toBe(0);
    expect((await get(u.key, `${q}&regions=nowhere`)).body.totalCount).toBe(0);
    expect((await get(u.key, `/api/v1/availability/multi-node?gpu_type=${p.gpuType}&page=2&page_size=1`)).body).toEqual({ items: [], totalCount: 1 });
    expect((await get(u.key, `/api/v1/availability/multi-node?page_size=101`)).status).toBe(422);
    // A pod on one of its nodes: the cluster is no longer rentable whole.
    await fund(u.walletId);
    const pod = await post(u.key, '/api/v1/pods', p.body());
    expect(pod.status).toBe(200);
    expect((await get(u.key, q)).body).toEqual({ items: [], totalCount: 0 });
  });

  it('answers an empty page, not a 404, where there is no cluster (the CLI merges it into every `availability list`)', async () => {
    const u = await newUser(['availability:read']);
    const r = await get(u.key, '/api/v1/availability/multi-node?gpu_type=NO_SUCH_GPU');
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ items: [], totalCount: 0 });
  });
});

describe('GET /api/v1/availability/gpu-summary', () => {
  it('answers {gpuType: {gpuCount: {cheapest, region: {onDemand, communityPrice, spotPrice}}}} over offers available now', async () => {
    const u = await newUser(['availability:read']);
    const p = await place({ nodes: 1, gpusPerNode: 2 });
    const r = await get(u.key, '/api/v1/availability/gpu-summary');
    expect(r.status).toBe(200);
    expect(r.body[p.gpuType]).toEqual({
      '1': { cheapest: { onDemand: 2, communityPrice: null, spotPrice: null }, [p.region]: { onDemand: 2, communityPrice: null, spotPrice: null } },
      '2': { cheapest: { onDemand: 4, communityPrice: null, spotPrice: null }, [p.region]: { onDemand: 4, communityPrice: null, spotPrice: null } },
    });
    // The seeded catalog's spot offers show as spotPrice.
    const cells = Object.values(r.body as Record<string, Record<string, Record<string, { spotPrice: number | null }>>>).flatMap((byCount) => Object.values(byCount).map((c) => c.cheapest!));
    expect(cells.some((c) => typeof c.spotPrice === 'number')).toBe(true);
  });
});
