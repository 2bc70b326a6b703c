import { afterAll, describe, expect, it } from 'vitest';
import { call, newUser } from './helpers.js';
import { openDb } from './money-helpers.js';

// Issue 17: revoking a key (the row kept with its revocation time), listing a user's keys without
// secrets, and a change made by another replica (here: a statement on the database, as another
// daemon's would be) taking effect on this daemon within the 2 s bound through LISTEN/NOTIFY.

const REPLICA_BOUND_MS = 2_000;
const db = openDb(1);
afterAll(() => db.end({ timeout: 1 }));

const whoami = (key: string) => call('platform', 'GET', '/api/v1/billing/wallet', { key });

async function refusedWithin(key: string, boundMs: number): Promise<number> {
  const t0 = Date.now();
  for (;;) {
    const r = await whoami(key);
    if (r.status === 401) return Date.now() - t0;
    if (Date.now() - t0 > boundMs) throw new Error(`key still answered ${r.status} after ${boundMs} ms`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

describe('API key revocation and listing', () => {
  it('revokes a key: refused at once, row kept with its revocation time, idempotent, listed without secrets', async () => {
    const u = await newUser(['teams:read']);
    expect((await whoami(u.key)).status).not.toBe(401);
    const del = await call('platform', 'DELETE', `/api/admin/api-keys/${u.keyId}`);
    expect(del.status).toBe(200);
    expect(del.body.data).toMatchObject({ id: u.keyId, userId: u.userId, permissions: ['teams:read'] });
    const revokedAt = del.body.data.revokedAt;
    expect(Date.parse(revokedAt)).toBeGreaterThan(Date.now() - 60_000);
    const r = await whoami(u.key);
    expect(r.status).toBe(401);
    // Again: same answer, same time.
    const again = await call('platform', 'DELETE', `/api/admin/api-keys/${u.keyId}`);
    expect(again.status).toBe(200);
    expect(again.body.data.revokedAt).toBe(revokedAt);

    const list = await call('platform', 'GET', `/api/admin/users/${u.userId}/api-keys`);
    expect(list.status).toBe(200);
    const row = list.body.data.find((k: { id: string }) => k.id === u.keyId);
    expect(row).toMatchObject({ id: u.keyId, revokedAt, permissions: ['teams:read'] });
    expect(u.key.startsWith(row.prefix)).toBe(true);
    const text = JSON.stringify(list.body);
    expect(text).not.toContain(u.key);
    expect(text).not.toMatch(/hash|secret/i);
  });

  it('answers 404 for an unknown key or user, 403 for a key the caller may not revoke', async () => {
    expect((await call('platform', 'DELETE', '/api/admin/api-keys/no-such-key')).status).toBe(404);
    expect((await call('platform', 'GET', '/api/admin/users/no-such-user/api-keys')).status).toBe(404);
    const narrow = await newUser(['admin:users', 'teams:read']);
    const stronger = await newUser(['admin:wallets']);
    const weaker = await newUser(['teams:read']);
    const denied = await call('platform', 'DELETE', `/api/admin/api-keys/${stronger.keyId}`, { key: narrow.key });
    expect(denied.status).toBe(403);
    expect(denied.body.errors[0]).toMatchObject({ param: 'keyId' });
    expect(denied.body.errors[0].details).toContain('admin:wallets');
    expect((await whoami(stronger.key)).status).not.toBe(401);
    expect((await call('platform', 'DELETE', `/api/admin/api-keys/${weaker.keyId}`, { key: narrow.key })).status).toBe(200);
    // A revoked key is unauthenticated; a live key without admin:users is forbidden the listing.
    expect((await call('platform', 'GET', `/api/admin/users/${weaker.userId}/api-keys`, { key: weaker.key })).status).toBe(401);
    const plain = await newUser(['teams:read']);
    expect((await call('platform', 'GET', `/api/admin/users/${plain.userId}/api-keys`, { key: plain.key })).status).toBe(403);
  });

  it('refuses a key revoked by another replica within the bound (cached lookup dropped by NOTIFY)', async () => {
    const u = await newUser(['teams:read']);
    // Warm this daemon's cache (its TTL is 10 s, far past the bound).
    expect((await whoami(u.key)).status).not.toBe(401);
    expect((await whoami(u.key)).status).not.toBe(401);
    await db`UPDATE api_keys SET revoked_at = now() WHERE id = ${u.keyId}`;
    const took = await refusedWithin(u.key, REPLICA_BOUND_MS);
    expect(took).toBeLessThan(REPLICA_BOUND_MS);
  });
});
