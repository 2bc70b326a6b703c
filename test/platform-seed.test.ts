import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { startDaemon, stopDaemon } from './daemon.js';
import { connectTo, fund } from './platform-helpers.js';

// Seeding runs at every start: a restart must neither duplicate the catalog nor
// give back capacity that live pods hold. Runs its own daemon (it restarts it).

describe('seed', () => {
  it('is idempotent across restarts and keeps capacity held by pods', async () => {
    let d = await startDaemon();
    const dataDir = d.dataDir;
    const adminKey = d.adminKey;
    try {
      const req = async (method: string, p: string, key: string, body?: unknown) => {
        const r = await fetch(d.platformUrl + p, { method, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: body ? JSON.stringify(body) : undefined });
        return { status: r.status, body: (await r.json()) as any };
      };
      const u = (await req('POST', '/api/admin/users', adminKey, { name: 'seed', email: `seed-${Date.now()}@test.io` })).body.data;
      const key = (await req('POST', '/api/admin/api-keys', adminKey, { userId: u.id, permissions: ['instances:write', 'availability:read'] })).body.data.key;
      const db = connectTo(dataDir);
      await fund(u.walletId, 10_000, db);
      await db.end();
      const offers = async () => (await req('GET', '/api/v1/availability/gpus?page_size=100&data_center_id=US-1', key)).body;
      const before = await offers();
      const target = before.items.find((o: any) => o.cloudId === 'n3-H100-SXM5x8');
      expect(target.stockStatus).toBe('Available');
      // Take two of the three 8-GPU H100 nodes.
      for (let i = 0; i < 2; i++) {
        const r = await req('POST', '/api/v1/pods', key, {
          pod: { cloudId: target.cloudId, gpuType: target.gpuType, socket: target.socket, gpuCount: 8, dataCenterId: 'US-1', country: 'US' },
          provider: { type: target.provider },
        });
        expect(r.status).toBe(200);
      }
      const held = await offers();
      expect(held.items.find((o: any) => o.cloudId === 'n3-H100-SXM5x8').stockStatus).toBe('Low');
      await stopDaemon(d);
      d = await startDaemon({ ADMIN_API_KEY: adminKey }, dataDir);
      const after = await offers();
      expect(after).toEqual(held);
      expect(after.totalCount).toBe(before.totalCount);
      expect((await req('GET', '/api/v1/pods', key)).body.total_count).toBe(2);
    } finally {
      await stopDaemon(d);
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  }, 60_000);
});
