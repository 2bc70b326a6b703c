import { afterAll, describe, expect, it } from 'vitest';
import { newUser } from './helpers.js';
import { closeDb, fund, get, place, post, del } from './platform-helpers.js';

afterAll(closeDb);

const reader = () => newUser(['availability:read', 'instances:write', 'disks:write']);

describe('GPU availability', () => {
  it('lists the seeded catalog: several providers and regions, CPU_NODE, fixed and adjustable specs, variable, spot and prepaid offers', async () => {
    const u = await reader();
    const items: any[] = [];
    let total = 0;
    for (let page = 1; page < 50; page++) {
      const r = await get(u.key, `/api/v1/availability/gpus?page=${page}&page_size=100`);
      expect(r.status).toBe(200);
      total = r.body.totalCount;
      items.push(...r.body.items);
      if (r.body.items.length < 100) break;
    }
    expect(Number.isInteger(total)).toBe(true);
    // The count is the filtered count (a client pages until it has that many); other tests may add offers meanwhile.
    expect(items.length).toBeGreaterThanOrEqual(100);
    const seeded = items.filter((o) => !o.provider.startsWith('prov-'));
    expect(new Set(seeded.map((o) => o.provider)).size).toBeGreaterThanOrEqual(5);
    const regions = new Set(seeded.map((o) => o.region));
    expect(regions.has('united_states') && regions.has('europe_west')).toBe(true);
    expect(seeded.some((o) => o.gpuType === 'CPU_NODE')).toBe(true);
    expect(seeded.some((o) => o.prices.isVariable === true)).toBe(true);
    expect(seeded.some((o) => o.isSpot === true)).toBe(true);
    expect(seeded.some((o) => typeof o.prepaidTime === 'number' && o.prepaidTime > 0)).toBe(true);
    expect(seeded.some((o) => o.disk.defaultIncludedInPrice === true) && seeded.some((o) => o.disk.defaultIncludedInPrice === false)).toBe(true);
    expect(seeded.some((o) => o.vcpu.minCount === null && o.vcpu.defaultCount !== null)).toBe(true); // fixed
    expect(seeded.some((o) => o.vcpu.minCount !== null)).toBe(true); // adjustable
    const o = seeded[0];
    // Every field of SPEC 2.2 present, nulls included.
    for (const k of ['cloudId', 'gpuType', 'socket', 'provider', 'region', 'dataCenter', 'country', 'gpuCount', 'gpuMemory', 'disk', 'vcpu', 'memory', 'sharedDisk', 'internetSpeed', 'interconnect', 'interconnectType', 'provisioningTime', 'stockStatus', 'security', 'prices', 'images', 'isSpot', 'prepaidTime']) {
      expect(o).toHaveProperty(k);
    }
    for (const k of ['minCount', 'maxCount', 'defaultCount', 'pricePerUnit', 'step', 'defaultIncludedInPrice', 'additionalInfo']) expect(o.sharedDisk).toHaveProperty(k);
    expect(o.prices.currency).toBe('USD');
    expect(['Available', 'Low']).toContain(o.stockStatus);
  });

  it('applies every filter together, keeps the order stable between calls, and counts the filtered set', async () => {
    const u = await reader();
    const p = await place({ nodes: 2, gpusPerNode: 8 });
    const q = `/api/v1/availability/gpus?regions=${p.region}&gpu_type=${p.gpuType}&socket=SXM&security=secure_cloud&data_center_id=${p.dc}&cloud_id=${p.cloudId}`;
    const all = await get(u.key, q);
    expect(all.status).toBe(200);
    expect(all.body.totalCount).toBe(2);
    expect(all.body.items.map((o: any) => o.gpuCount)).toEqual([1, 2]); // cheaper first
    const again = await get(u.key, q);
    expect(again.body).toEqual(all.body);
    const two = await get(u.key, `${q}&gpu_count=2`);
    expect(two.body.totalCount).toBe(2 - 1);
    expect(two.body.items[0]).toMatchObject({ gpuCount: 2, dataCenter: p.dc, provider: p.provider, region: p.region, country: 'US', cloudId: p.cloudId });
    // Each filter alone excludes what it should while the others still apply.
    const base: Record<string, string> = { regions: p.region, gpu_type: p.gpuType, socket: 'SXM', security: 'secure_cloud', data_center_id: p.dc, cloud_id: p.cloudId };
    for (const [k, v] of [['socket', 'PCIe'], ['security', 'community_cloud'], ['data_center_id', 'nowhere'], ['cloud_id', 'other'], ['gpu_type', 'H100_80GB'], ['gpu_count', '3'], ['regions', 'europe_west']]) {
      const r = await get(u.key, `/api/v1/availability/gpus?${new URLSearchParams({ ...base, [k!]: v! })}`);
      expect(r.status).toBe(200);
      expect(r.body, k).toEqual({ items: [], totalCount: 0 });
    }
    // regions is repeatable and takes comma lists; an unmatched value beside a matched one still matches.
    expect((await get(u.key, `/api/v1/availability/gpus?regions=europe_west&gpu_type=${p.gpuType}`)).body.totalCount).toBe(0);
    const rep = await get(u.key, `/api/v1/availability/gpus?regions=europe_west&regions=${p.region}&gpu_type=${p.gpuType}`);
    expect(rep.body.totalCount).toBe(2);
    const comma = await get(u.key, `/api/v1/availability/gpus?regions=europe_west,${p.region}&gpu_type=${p.gpuType}`);
    expect(comma.body.totalCount).toBe(2);
  });

  it('pages with page and page_size within SPEC 8 limits and refuses values outside them with 422', async () => {
    const u = await reader();
    const a = await get(u.key, '/api/v1/availability/gpus?page_size=7');
    const b = await get(u.key, '/api/v1/availability/gpus?page_size=7&page=2');
    expect(a.body.items).toHaveLength(7);
    expect(b.body.items).toHaveLength(7);
    const firstIds = a.body.items.map((o: any) => `${o.cloudId}/${o.dataCenter}/${o.gpuCount}`);
    expect(b.body.items.some((o: any) => firstIds.includes(`${o.cloudId}/${o.dataCenter}/${o.gpuCount}`))).toBe(false);
    expect((await get(u.key, '/api/v1/availability/gpus?page_size=100')).status).toBe(200);
    expect((await get(u.key, '/api/v1/availability/gpus?page=1&page_size=1')).body.items).toHaveLength(1);
    const past = await get(u.key, '/api/v1/availability/gpus?page=10000&page_size=100');
    expect(past.status).toBe(200);
    expect(past.body.items).toEqual([]);
    expect(past.body.totalCount).toBeGreaterThan(100);
    for (const [qs, param] of [
      ['page_size=101', 'page_size'],
      ['page_size=0', 'page_size'],
      ['page=0', 'page'],
      ['page=-1', 'page'],
      ['page=abc', 'page'],
      ['page_size=1.5', 'page_size'],
      ['gpu_count=0', 'gpu_count'],
      ['gpu_count=two', 'gpu_count'],
    ]) {
      const r = await get(u.key, `/api/v1/availability/gpus?${qs}`);
      expect(r.status, qs).toBe(422);
      expect(r.body.errors[0].param).toBe(param);
      expect(r.body.errors[0].details).toContain(qs.split('=')[1]);
    }
  });

  it('follows free capacity: stockStatus goes Low, the offer disappears when full, and returns after a delete', async () => {
    const u = await newUser(['availability:read', 'instances:write']);
    await fund(u.walletId);
    const p = await place({ nodes: 1, gpusPerNode: 4 });
    const q = `/api/v1/availability/gpus?data_center_id=${p.dc}&gpu_count=1`;
    const offer = async () => (await get(u.key, q)).body.items[0];
    expect((await offer()).stockStatus).toBe('Available'); // 4 placements
    const pods: string[] = [];
    for (let i = 0; i < 2; i++) {
      const r = await post(u.key, '/api/v1/pods', p.body());
      expect(r.status).toBe(200);
      pods.push(r.body.id);
    }
    expect((await offer()).stockStatus).toBe('Low'); // 2 left
    for (let i = 0; i < 2; i++) pods.push((await post(u.key, '/api/v1/pods', p.body())).body.id);
    expect(await offer()).toBeUndefined();
    expect((await get(u.key, q)).body.totalCount).toBe(0);
    expect((await del(u.key, `/api/v1/pods/${pods[0]}`)).status).toBe(200);
    expect((await offer()).stockStatus).toBe('Low');
  });

  it('restricts to locations where the given disks attach, with the other filters still applied', async () => {
    const u = await newUser(['availability:read', 'disks:write']);
    await fund(u.walletId);
    const p = await place({ nodes: 1, gpusPerNode: 2 });
    const other = await place({ nodes: 1, gpusPerNode: 2 });
    const mk = async (pl: typeof p) => (await post(u.key, '/api/v1/disks', { disk: { size: 10, dataCenterId: pl.dc }, provider: { type: pl.provider } })).body.id;
    const d1 = await mk(p);
    const d2 = await mk(p);
    const d3 = await mk(other);
    const r = await get(u.key, `/api/v1/availability/gpus?disks=${d1}&disks=${d2}`);
    expect(r.status).toBe(200);
    expect(r.body.totalCount).toBe(2);
    expect(r.body.items.every((o: any) => o.dataCenter === p.dc)).toBe(true);
    expect((await get(u.key, `/api/v1/availability/gpus?disks=${d1}&gpu_count=2`)).body.totalCount).toBe(1);
    expect((await get(u.key, `/api/v1/availability/gpus?disks=${d1}&regions=europe_west`)).body.totalCount).toBe(0);
    // Disks in two places can never attach to one pod.
    expect((await get(u.key, `/api/v1/availability/gpus?disks=${d1},${d3}`)).body).toEqual({ items: [], totalCount: 0 });
    // More disks than the provider attaches (maxDisksPerPod 2 in this place).
    const d4 = await mk(p);
    expect((await get(u.key, `/api/v1/availability/gpus?disks=${d1}&disks=${d2}&disks=${d4}`)).body.totalCount).toBe(0);
    // Someone else's disk is not found.
    const stranger = await newUser(['availability:read']);
    const foreign = await get(stranger.key, `/api/v1/availability/gpus?disks=${d1}`);
    expect(foreign.status).toBe(404);
  });

  it('needs availability:read', async () => {
    const u = await newUser(['instances:read']);
    expect((await get(u.key, '/api/v1/availability/gpus')).status).toBe(403);
    expect((await get(u.key, '/api/v1/availability/disks')).status).toBe(403);
  });
});

describe('disk availability', () => {
  it('lists single and multinode disk offers with the filters and paging of SPEC 4.1', async () => {
    const u = await reader();
    const r = await get(u.key, '/api/v1/availability/disks');
    expect(r.status).toBe(200);
    const seeded = r.body.items.filter((d: any) => !d.provider.startsWith('prov-'));
    expect(seeded.some((d: any) => d.isMultinode) && seeded.some((d: any) => !d.isMultinode)).toBe(true);
    for (const k of ['cloudId', 'provider', 'dataCenter', 'country', 'region', 'spec', 'stockStatus', 'security', 'isMultinode']) expect(seeded[0]).toHaveProperty(k);
    const p = await place({ multinode: true });
    const mine = await get(u.key, `/api/v1/availability/disks?regions=${p.region}&data_center_id=${p.dc}`);
    expect(mine.body.totalCount).toBe(1);
    expect(mine.body.items[0]).toMatchObject({ provider: p.provider, dataCenter: p.dc, isMultinode: true, cloudId: null, spec: { minCount: 10, maxCount: 500, pricePerUnit: 0.0002 } });
    expect((await get(u.key, `/api/v1/availability/disks?regions=${p.region}&cloud_id=nope`)).body.totalCount).toBe(0);
    const page = await get(u.key, '/api/v1/availability/disks?page_size=1&page=2');
    expect(page.body.items).toHaveLength(1);
    expect(page.body.items[0]).not.toEqual(r.body.items[0]);
    expect((await get(u.key, '/api/v1/availability/disks?page_size=101')).status).toBe(422);
    expect((await get(u.key, '/api/v1/availability/disks?page=0')).status).toBe(422);
  });
});
