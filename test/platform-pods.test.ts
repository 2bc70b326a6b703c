import { afterAll, describe, expect, it } from 'vitest';
import { addMember, call, daemon, newTeam, newUser } from './helpers.js';
import { closeDb, connectTo, del, fund, get, ledger, meters, place, post, setBalance, until } from './platform-helpers.js';

afterAll(closeDb);

const RW = ['instances:write', 'availability:read', 'disks:write'];

async function funded(perms = RW) {
  const u = await newUser(perms);
  await fund(u.walletId);
  return u;
}

const waitActive = (key: string, id: string) =>
  until(
    () => get(key, `/api/v1/pods/${id}`),
    (r) => r.body?.status === 'ACTIVE' && r.body.attachedResources.every((a: any) => a.id === 'ephemeral' || a.status === 'MOUNTED'),
  );

describe('pod create', () => {
  it('answers the pod record in PROVISIONING with prices by SPEC 2.11, then walks to ACTIVE with connection data', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 2 });
    const r = await call('platform', 'POST', '/api/v1/pods/', { key: u.key, body: p.body({ diskSize: 300 }) });
    expect(r.status).toBe(200);
    const pod = r.body;
    expect(pod).toMatchObject({
      userId: u.userId,
      teamId: null,
      walletId: u.walletId,
      providerType: p.provider,
      type: 'HOSTED',
      status: 'PROVISIONING',
      installationStatus: 'PENDING',
      installationFailure: null,
      sshConnection: null,
      ip: null,
      gpuName: p.gpuType,
      gpuCount: 1,
      socket: 'SXM',
      environmentType: 'img_a',
      customTemplateId: null,
      terminatedAt: null,
      // 2.00 on demand + 300 GB disk (not the included default) x 0.0001 + vCPU fixed + 64 GB memory x 0.002 (charged default)
      priceHr: 2.158,
      provisioningPriceHr: 0.03,
      stoppedPriceHr: 0.03,
      resources: { memory: 64, disk: 300, vcpus: 16, sharedDisk: null },
      primePortMapping: [],
    });
    expect(pod.attachedResources).toEqual([
      { resourceType: 'DISK', id: 'ephemeral', status: 'ATTACHED', isDetachable: false, mountPath: '/ephemeral', resourcePath: '/dev/nvme0n1', size: 300, isShared: false },
    ]);
    expect(typeof pod.createdAt).toBe('string');
    expect(pod.isSpot).toBe(false);
    expect(pod).toHaveProperty('clusterId', null);
    expect(pod).toHaveProperty('autoRestart', null);

    const ready = await waitActive(u.key, pod.id);
    expect(ready.body).toMatchObject({ status: 'ACTIVE', installationStatus: 'FINISHED', installationProgress: 100 });
    expect(ready.body.ip).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(ready.body.sshConnection).toBe(`root@${ready.body.ip} -p 22`);
    expect(ready.body.primePortMapping).toEqual([
      { internal: '22', external: '22', protocol: 'TCP', usedBy: 'SSH', description: 'SSH' },
      { internal: '*', external: '*', protocol: 'TCP', usedBy: null, description: expect.any(String) },
    ]);
    // The list schema: resources as strings under shared_disk.
    expect(ready.body.resources).toEqual({ memory: '64', disk: '300', vcpus: '16', shared_disk: null });
  });

  it('reads back the same record it created (stored list form: resources as strings under shared_disk)', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 2, extra: { provisioningTime: 100 } });
    const created = (await post(u.key, '/api/v1/pods', p.body({ diskSize: 250, memory: 16 }))).body;
    const read = (await get(u.key, `/api/v1/pods/${created.id}`)).body;
    expect(read).toEqual({ ...created, resources: { memory: '16', disk: '250', vcpus: '16', shared_disk: null } });
    const listed = (await get(u.key, '/api/v1/pods')).body.data[0];
    expect(listed).toEqual(read);
  });

  it('accepts explicit nulls, extra keys and both slash forms (what real clients send)', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 2 });
    const b = p.body({ memory: null, diskSize: null, vcpus: null, maxPrice: null, envVars: [{ key: 'A', value: 'b' }], jupyterPassword: null, autoRestart: null, customTemplateId: null });
    const r = await call('platform', 'POST', '/api/v1/pods', { key: u.key, body: { ...b, team: null, disks: null, sharedWithTeam: null, teamMemberIds: null, unknownKey: 1 } });
    expect(r.status).toBe(200);
    expect(r.body.resources).toEqual({ memory: 64, disk: 200, vcpus: 16, sharedDisk: null });
    expect(r.body.priceHr).toBe(2.128);
    const list = await call('platform', 'GET', '/api/v1/pods/', { key: u.key });
    expect(list.body.data.map((x: any) => x.id)).toContain(r.body.id);
  });

  it('validates every field against the offer: the boundary value is accepted, one past it refused with 422 naming the field', async () => {
    const u = await funded();
    const p = await place({ nodes: 2, gpusPerNode: 8 });
    const refused: [Record<string, unknown>, string, Record<string, unknown>?][] = [
      [{ cloudId: 'no-such-cloud' }, 'pod.cloudId'],
      [{ gpuCount: 3 }, 'pod.gpuCount'],
      [{ gpuCount: 0 }, 'pod.gpuCount'],
      [{ gpuCount: 1.5 }, 'pod.gpuCount'],
      [{ dataCenterId: null }, 'pod.dataCenterId'],
      [{ dataCenterId: 'OTHER-DC' }, 'pod.dataCenterId'],
      [{ gpuType: 'H100_80GB' }, 'pod.gpuType'],
      [{ socket: 'PCIe' }, 'pod.socket'],
      [{ security: 'community_cloud' }, 'pod.security'],
      [{ country: 'DE' }, 'pod.country'],
      [{ image: 'windows' }, 'pod.image'],
      [{ diskSize: 99 }, 'pod.diskSize'],
      [{ diskSize: 1001 }, 'pod.diskSize'],
      [{ diskSize: 120 }, 'pod.diskSize'],
      [{ vcpus: 17 }, 'pod.vcpus'],
      [{ memory: 136 }, 'pod.memory'],
      [{ memory: 4 }, 'pod.memory'],
      [{ memory: 12 }, 'pod.memory'],
      [{ maxPrice: 2.1279 }, 'pod.maxPrice'],
      [{ maxPrice: 0 }, 'pod.maxPrice'],
      [{ name: 'x'.repeat(256) }, 'pod.name'],
    ];
    for (const [over, param] of refused) {
      const r = await post(u.key, '/api/v1/pods', p.body(over));
      expect(r.status, JSON.stringify(over)).toBe(422);
      expect(r.body.errors[0].param, JSON.stringify(over)).toBe(param);
      expect(r.body.errors[0].details).toContain(param);
    }
    const noProvider = await post(u.key, '/api/v1/pods', { pod: p.body().pod });
    expect(noProvider.status).toBe(422);
    expect(noProvider.body.errors[0].param).toBe('provider');
    const wrongProvider = await post(u.key, '/api/v1/pods', { ...p.body(), provider: { type: 'runpod' } });
    expect(wrongProvider.body.errors[0].param).toBe('provider.type');
    expect((await post(u.key, '/api/v1/pods', {})).body.errors.map((e: any) => e.param)).toEqual(['pod', 'provider']);

    const accepted: Record<string, unknown>[] = [
      { diskSize: 100 },
      { diskSize: 1000 },
      { diskSize: 150 },
      { vcpus: 16 },
      { memory: 128 },
      { memory: 8 },
      { maxPrice: 2.128 },
      { image: 'img_b' },
      { socket: null, security: null, country: null, image: null },
      { name: 'x'.repeat(255) },
    ];
    for (const over of accepted) {
      const r = await post(u.key, '/api/v1/pods', p.body(over));
      expect(r.status, JSON.stringify(over)).toBe(200);
    }
    const two = await post(u.key, '/api/v1/pods', p.body({}, 2));
    expect(two.status).toBe(200);
    expect(two.body.gpuCount).toBe(2);
  });

  it('refuses with 402 when the paying wallet is at or below zero', async () => {
    const u = await newUser(RW);
    const p = await place();
    const r = await post(u.key, '/api/v1/pods', p.body());
    expect(r.status).toBe(402);
    expect(r.body.errors[0].details).toContain('a pod');
    await setBalance(u.walletId, 1);
    expect((await post(u.key, '/api/v1/pods', p.body())).status).toBe(200);
    // A team pod is paid by the team's wallet, which is empty.
    const team = await newTeam();
    await addMember(team.id, u.userId);
    expect((await post(u.key, '/api/v1/pods', { ...p.body(), team: { teamId: team.id } })).status).toBe(402);
  });

  it('bills a team pod to the team wallet; only members may name the team', async () => {
    const u = await funded();
    const outsider = await funded();
    const team = await newTeam();
    await addMember(team.id, u.userId);
    await fund(team.walletId);
    const p = await place({ gpusPerNode: 4 });
    const r = await post(u.key, '/api/v1/pods', { ...p.body(), team: { teamId: team.id } });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ teamId: team.id, walletId: team.walletId, userId: u.userId });
    const no = await post(outsider.key, '/api/v1/pods', { ...p.body(), team: { teamId: team.id } });
    expect(no.status).toBe(403);
    expect(no.body.errors[0].param).toBe('team.teamId');
  });

  it('applies the sharing rules: sharedWithTeam shares with every member, teamMemberIds with those listed, sharedWithTeam wins', async () => {
    const [owner, a, b, outsider] = await Promise.all([funded(), funded(), funded(), funded()]);
    const team = await newTeam();
    for (const m of [owner, a, b]) await addMember(team.id, m.userId);
    await fund(team.walletId);
    const p = await place({ gpusPerNode: 8 });
    const t = { team: { teamId: team.id } };

    expect((await post(owner.key, '/api/v1/pods', { ...p.body(), sharedWithTeam: true })).body.errors[0].param).toBe('sharedWithTeam');
    expect((await post(owner.key, '/api/v1/pods', { ...p.body(), teamMemberIds: [a.userId] })).body.errors[0].param).toBe('teamMemberIds');
    const notMember = await post(owner.key, '/api/v1/pods', { ...p.body(), ...t, teamMemberIds: [a.userId, outsider.userId] });
    expect(notMember.status).toBe(422);
    expect(notMember.body.errors[0].param).toBe('teamMemberIds.1');

    const shared = (await post(owner.key, '/api/v1/pods', { ...p.body(), ...t, sharedWithTeam: true })).body;
    const toA = (await post(owner.key, '/api/v1/pods', { ...p.body(), ...t, teamMemberIds: [a.userId] })).body;
    const snake = (await post(owner.key, '/api/v1/pods', { ...p.body(), ...t, shared_with_team: true })).body;
    const both = (await post(owner.key, '/api/v1/pods', { ...p.body(), ...t, sharedWithTeam: true, teamMemberIds: [a.userId] })).body;
    const privateTeamPod = (await post(owner.key, '/api/v1/pods', { ...p.body(), ...t })).body;
    expect(shared.sharedWithTeam).toBe(true);
    expect(snake.sharedWithTeam).toBe(true);

    const seen = async (who: { key: string }) => new Set((await get(who.key, '/api/v1/pods?limit=1000')).body.data.map((x: any) => x.id));
    const [sa, sb, so] = await Promise.all([seen(a), seen(b), seen(outsider)]);
    expect([shared.id, toA.id, snake.id, both.id].every((id) => sa.has(id))).toBe(true);
    expect(sb.has(shared.id) && sb.has(snake.id) && sb.has(both.id)).toBe(true);
    expect(sb.has(toA.id)).toBe(false);
    expect(sa.has(privateTeamPod.id) || sb.has(privateTeamPod.id)).toBe(false);
    expect([shared.id, toA.id, both.id].some((id) => so.has(id))).toBe(false);
    expect((await get(b.key, `/api/v1/pods/${shared.id}`)).status).toBe(200);
    expect((await get(b.key, `/api/v1/pods/${toA.id}`)).status).toBe(404);
    expect((await get(outsider.key, `/api/v1/pods/${shared.id}`)).status).toBe(404);
    // A member it is shared with can read it but not delete it.
    const d = await del(a.key, `/api/v1/pods/${toA.id}`);
    expect(d.status).toBe(403);
    expect((await del(outsider.key, `/api/v1/pods/${toA.id}`)).status).toBe(404);
    expect((await del(owner.key, `/api/v1/pods/${toA.id}`)).status).toBe(200);
  });
});

describe('pod reads, status and delete', () => {
  it('lists with offset and limit, newest first, with integer counts; refuses out-of-range paging', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 8 });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await post(u.key, '/api/v1/pods', p.body({ name: `n${i}` }))).body.id);
    const all = await get(u.key, '/api/v1/pods');
    expect(all.body).toMatchObject({ total_count: 3, offset: 0, limit: 100, status: 'success' });
    expect(all.body.data.map((x: any) => x.id)).toEqual([...ids].reverse());
    const page = await get(u.key, '/api/v1/pods?offset=1&limit=1');
    expect(page.body).toMatchObject({ total_count: 3, offset: 1, limit: 1 });
    expect(page.body.data.map((x: any) => x.id)).toEqual([ids[1]]);
    const past = await get(u.key, '/api/v1/pods?offset=10');
    expect(past.body).toMatchObject({ total_count: 3, data: [] });
    expect((await get(u.key, '/api/v1/pods?limit=1000')).status).toBe(200);
    for (const qs of ['limit=0', 'limit=1001', 'offset=-1', 'limit=x']) {
      const r = await get(u.key, `/api/v1/pods?${qs}`);
      expect(r.status, qs).toBe(422);
      expect(r.body.errors[0].param).toBe(qs.split('=')[0]);
    }
    const other = await funded();
    expect((await get(other.key, '/api/v1/pods')).body.total_count).toBe(0);
    expect((await get(other.key, `/api/v1/pods/${ids[0]}`)).status).toBe(404);
    expect((await del(other.key, `/api/v1/pods/${ids[0]}`)).status).toBe(404);
  });

  it('lists what another daemon on the same database changed: cached lists follow its commits', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 8 });
    const a = (await post(u.key, '/api/v1/pods', p.body({ name: 'seen-a' }))).body.id;
    const b = (await post(u.key, '/api/v1/pods', p.body({ name: 'seen-b' }))).body.id;
    const ids = async () => (await get(u.key, '/api/v1/pods')).body.data.map((x: any) => x.id);
    expect(await ids()).toEqual([b, a]);
    expect(await ids()).toEqual([b, a]); // now answered from the cache
    // Another daemon (here: a plain connection) renames and terminates pods in its own transactions.
    const other = connectTo(daemon().dataDir);
    try {
      await other`UPDATE pods SET doc = jsonb_set(doc::jsonb, '{name}', '"renamed"')::text WHERE id = ${a}`;
      const named = await until(() => get(u.key, '/api/v1/pods'), (r) => r.body.data.some((x: any) => x.name === 'renamed'), 2_000);
      expect(named.body.data.find((x: any) => x.id === a).name).toBe('renamed');
      await other`UPDATE pods SET terminated_at = now(), status = 'TERMINATED' WHERE id = ${b}`;
      const gone = await until(() => get(u.key, '/api/v1/pods'), (r) => r.body.total_count === 1, 2_000);
      expect(gone.body.data.map((x: any) => x.id)).toEqual([a]);
    } finally {
      await other.end({ timeout: 1 });
    }
  });

  it('answers status records with costPerHr by state, for the listed pod_ids only', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 8, extra: { provisioningTime: 100 } }); // 100 min x 0.002 = 12 s
    const slow = (await post(u.key, '/api/v1/pods', p.body({ diskSize: 300 }))).body;
    const fast = (await post(u.key, '/api/v1/pods', p.body({ diskSize: 300 }, 2))).body;
    const other = await funded();
    const foreign = (await post(other.key, '/api/v1/pods', p.body())).body;
    const r = await get(u.key, `/api/v1/pods/status/?pod_ids=${slow.id}&pod_ids=${fast.id}&pod_ids=${foreign.id}&pod_ids=nope`);
    expect(r.status).toBe(200);
    expect(r.body.data.map((s: any) => s.podId).sort()).toEqual([slow.id, fast.id].sort());
    const s = r.body.data.find((x: any) => x.podId === slow.id);
    expect(s).toEqual({
      podId: slow.id,
      providerType: p.provider,
      status: 'PROVISIONING',
      sshConnection: null,
      costPerHr: 0.03,
      priceHr: 0.03, // the name Prime's CLI reads
      primePortMapping: [],
      ip: null,
      installationFailure: null,
      installationProgress: 0,
    });
    const ready = await until(
      () => get(u.key, `/api/v1/pods/status?pod_ids=${fast.id}`),
      (x) => x.body.data[0]?.status === 'ACTIVE',
    );
    expect(ready.body.data[0]).toMatchObject({ status: 'ACTIVE', costPerHr: fast.priceHr, priceHr: fast.priceHr, installationProgress: 100 });
    expect(ready.body.data[0].sshConnection).toContain('root@');
    const many = Array.from({ length: 101 }, (_, i) => `pod_ids=x${i}`).join('&');
    expect((await get(u.key, `/api/v1/pods/status?${many}`)).status).toBe(422);
  });

  it('deletes with write permission: capacity released, pod gone from get and list, kept in history with its billed total', async () => {
    const u = await funded(['instances:write', 'availability:read']);
    const reader = await newUser(['instances:read']);
    const p = await place({ gpusPerNode: 1 });
    const pod = (await post(u.key, '/api/v1/pods', p.body())).body;
    expect((await get(u.key, `/api/v1/availability/gpus?data_center_id=${p.dc}`)).body.totalCount).toBe(0);
    expect((await del(reader.key, `/api/v1/pods/${pod.id}`)).status).toBe(403);
    await waitActive(u.key, pod.id);
    const r = await del(u.key, `/api/v1/pods/${pod.id}`);
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ id: pod.id, status: 'TERMINATED' });
    expect((await get(u.key, `/api/v1/pods/${pod.id}`)).status).toBe(404);
    expect((await get(u.key, '/api/v1/pods')).body.data).toEqual([]);
    expect((await del(u.key, `/api/v1/pods/${pod.id}`)).status).toBe(404);
    expect((await get(u.key, `/api/v1/availability/gpus?data_center_id=${p.dc}`)).body.totalCount).toBe(1);
    const h = await get(u.key, '/api/v1/pods/history');
    expect(h.status).toBe(200);
    expect(h.body).toMatchObject({ total_count: 1, offset: 0, limit: 100 });
    const rows = await ledger(u.walletId);
    const billed = rows.filter((t) => t.ref_id === pod.id).reduce((s, t) => s - Number(t.amount), 0) / 10_000;
    expect(h.body.data[0]).toEqual({
      id: pod.id,
      name: pod.name,
      providerType: p.provider,
      provisionedBy: expect.any(String),
      type: 'HOSTED',
      createdAt: pod.createdAt,
      terminatedAt: expect.any(String),
      gpuName: p.gpuType,
      gpuCount: 1,
      socket: 'SXM',
      priceHr: 2.128,
      userId: u.userId,
      teamId: null,
      totalBilledPrice: billed,
    });
    const m = await meters('pod', pod.id);
    expect(m.map((x) => x.state)).toEqual(['PROVISIONING', 'ACTIVE']);
    expect(Number(m[0]!.rate_units_per_hr)).toBe(0);
    expect(Number(m[1]!.rate_units_per_hr)).toBe(21_280);
    expect(m[0]!.started_at.toISOString()).toBe(pod.createdAt);
    expect(m[0]!.ended_at!.getTime()).toBe(m[1]!.started_at.getTime());
    expect(m[1]!.ended_at!.toISOString()).toBe(h.body.data[0].terminatedAt);
  });

  it('charges prepaid hours at order and starts the meter after them', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 2, extra: { prepaidTime: 2 } });
    const pod = (await post(u.key, '/api/v1/pods', p.body())).body;
    expect(pod.prepaidUntil).toBe(new Date(Date.parse(pod.createdAt) + 2 * 3600_000).toISOString());
    const charge = (await ledger(u.walletId)).filter((t) => t.type === 'PREPAID_CHARGE');
    expect(charge).toEqual([{ amount: String(-2 * 21_280), type: 'PREPAID_CHARGE', ref_type: 'pod', ref_id: pod.id }]);
    await waitActive(u.key, pod.id);
    const m = await meters('pod', pod.id);
    expect(m.map((x) => x.state)).toEqual(['PROVISIONING', 'ACTIVE']);
    expect(m[1]!.started_at.toISOString()).toBe(pod.prepaidUntil);
    expect((await del(u.key, `/api/v1/pods/${pod.id}`)).status).toBe(200);
    const h = await get(u.key, '/api/v1/pods/history');
    expect(h.body.data[0].totalBilledPrice).toBe(4.256);
  });
});

describe('pods with disks', () => {
  async function activeDisk(key: string, p: { provider: string; dc: string }, size = 50) {
    const d = (await post(key, '/api/v1/disks', { disk: { size, dataCenterId: p.dc }, provider: { type: p.provider } })).body;
    await until(() => get(key, `/api/v1/disks/${d.id}`), (r) => r.body.status === 'ACTIVE');
    return d.id as string;
  }

  it('attaches disks UNATTACHED, then ATTACHED and MOUNTED at /data, with resources.disk the sum', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 2 });
    const d1 = await activeDisk(u.key, p, 50);
    const d2 = await activeDisk(u.key, p, 70);
    const r = await post(u.key, '/api/v1/pods', { ...p.body(), disks: [d1, d2] });
    expect(r.status).toBe(200);
    expect(r.body.resources.disk).toBe(200 + 50 + 70);
    expect(r.body.attachedResources.map((a: any) => [a.id, a.status, a.mountPath, a.size])).toEqual([
      ['ephemeral', 'ATTACHED', '/ephemeral', 200],
      [d1, 'UNATTACHED', '/data', 50],
      [d2, 'UNATTACHED', '/data-2', 70],
    ]);
    const ready = await waitActive(u.key, r.body.id);
    expect(ready.body.attachedResources.map((a: any) => a.status)).toEqual(['ATTACHED', 'MOUNTED', 'MOUNTED']);
    expect(ready.body.resources.disk).toBe('320');
    const disk = await get(u.key, `/api/v1/disks/${d1}`);
    expect(disk.body.pods).toEqual([r.body.id]);
    // In use: the disk cannot be deleted while the pod lives.
    const busy = await del(u.key, `/api/v1/disks/${d1}`);
    expect(busy.status).toBe(409);
    expect(busy.body.errors[0].details).toContain(r.body.id);
    expect((await del(u.key, `/api/v1/pods/${r.body.id}`)).status).toBe(200);
    // Detached after a moment, then deletable.
    const gone = await until(() => del(u.key, `/api/v1/disks/${d1}`), (x) => x.status === 200);
    expect(gone.body).toEqual({ status: 'TERMINATED' });
  });

  it('refuses disks that are foreign, not ACTIVE, elsewhere, repeated, over the provider limit, or held by another pod', async () => {
    const u = await funded();
    const stranger = await funded();
    const p = await place({ gpusPerNode: 8, maxDisks: 2 });
    const elsewhere = await place({ gpusPerNode: 1 });
    const [d1, d2, d3] = [await activeDisk(u.key, p), await activeDisk(u.key, p), await activeDisk(u.key, p)];
    const far = await activeDisk(u.key, elsewhere);
    const foreign = await activeDisk(stranger.key, p);
    const dead = await activeDisk(u.key, p);
    expect((await del(u.key, `/api/v1/disks/${dead}`)).status).toBe(200);
    const cases: [string[], number, string][] = [
      [[foreign], 404, 'disks.0'],
      [[d1, 'no-such-disk'], 404, 'disks.1'],
      [[dead], 409, 'disks.0'],
      [[far], 422, 'disks.0'],
      [[d1, d1], 422, 'disks'],
      [[d1, d2, d3], 422, 'disks'],
    ];
    for (const [disks, status, param] of cases) {
      const r = await post(u.key, '/api/v1/pods', { ...p.body(), disks });
      expect(r.status, disks.join()).toBe(status);
      expect(r.body.errors[0].param).toBe(param);
    }
    expect((await post(u.key, '/api/v1/pods', { ...p.body(), disks: [d1, d2] })).status).toBe(200);
    const held = await post(u.key, '/api/v1/pods', { ...p.body(), disks: [d1] });
    expect(held.status).toBe(409);
    expect(held.body.errors[0].details).toContain('not multinode');
  });

  it('lets a multinode disk serve several pods at once', async () => {
    const u = await funded();
    const p = await place({ gpusPerNode: 4, multinode: true });
    const d = await activeDisk(u.key, p);
    const a = await post(u.key, '/api/v1/pods', { ...p.body(), disks: [d] });
    const b = await post(u.key, '/api/v1/pods', { ...p.body(), disks: [d] });
    expect([a.status, b.status]).toEqual([200, 200]);
    expect(b.body.attachedResources[1]).toMatchObject({ id: d, isShared: true, resourcePath: `/mnt/shared/${d}` });
    expect((await get(u.key, `/api/v1/disks/${d}`)).body.pods.sort()).toEqual([a.body.id, b.body.id].sort());
  });
});

describe('capacity races', () => {
  it('two orders for the last GPU: one wins, the other gets a clear 409', async () => {
    const u = await funded();
    const p = await place({ nodes: 1, gpusPerNode: 1 });
    for (let round = 0; round < 5; round++) {
      const [a, b] = await Promise.all([post(u.key, '/api/v1/pods', p.body()), post(u.key, '/api/v1/pods', p.body())]);
      const statuses = [a.status, b.status].sort();
      expect(statuses).toEqual([200, 409]);
      const loser = a.status === 409 ? a : b;
      expect(loser.body.errors[0].details).toContain('no capacity left');
      const winner = a.status === 200 ? a : b;
      expect((await del(u.key, `/api/v1/pods/${winner.body.id}`)).status).toBe(200);
    }
  });

  it('many concurrent orders never take more GPUs than exist', async () => {
    const u = await funded();
    const p = await place({ nodes: 2, gpusPerNode: 2 });
    const rs = await Promise.all(Array.from({ length: 12 }, () => post(u.key, '/api/v1/pods', p.body())));
    expect(rs.filter((r) => r.status === 200)).toHaveLength(4);
    expect(rs.filter((r) => r.status === 409)).toHaveLength(8);
    expect((await get(u.key, '/api/v1/pods')).body.total_count).toBe(4);
  });
});
