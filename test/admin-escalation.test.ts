import { describe, expect, it } from 'vitest';
import { call, newUser } from './helpers.js';

// Issue 12.1: a key may grant only what it holds. Every admin scope is tried against every other,
// on issuance and on the PATCH that changes a key's limits; a denied grant writes nothing.

const ADMIN_SCOPES = ['admin:*', 'admin:wallets', 'admin:disks', 'admin:users', 'admin:invoices', 'admin:inventory'];

describe('admin escalation', () => {
  it('lets a key issue only permissions it holds, for every admin scope against every other', async () => {
    const target = await newUser(['teams:read']);
    for (const held of ADMIN_SCOPES) {
      const caller = await newUser([held]);
      for (const wanted of ADMIN_SCOPES) {
        const r = await call('platform', 'POST', '/api/admin/api-keys', { key: caller.key, body: { userId: target.userId, permissions: [wanted] } });
        // Issuance needs admin:users (or admin:*) to be reached at all; then the grant rule decides.
        const reachable = held === 'admin:*' || held === 'admin:users';
        const allowed = held === 'admin:*' || held === wanted;
        expect({ held, wanted, status: r.status }).toEqual({ held, wanted, status: !reachable ? 403 : allowed ? 201 : 403 });
        if (reachable && !allowed) {
          expect(r.body.errors[0]).toMatchObject({ param: 'permissions' });
          expect(r.body.errors[0].details).toContain(wanted);
        }
      }
    }
  });

  it('refuses the escalation the probe found: admin:users cannot mint admin:* and then top up', async () => {
    const narrow = await newUser(['admin:users']);
    const r = await call('platform', 'POST', '/api/admin/api-keys', { key: narrow.key, body: { userId: narrow.userId, permissions: ['admin:users', 'admin:*'] } });
    expect(r.status).toBe(403);
    expect(r.body.errors[0].details).toContain('admin:*');
    const topup = await call('platform', 'POST', '/api/admin/transactions/topup', { key: narrow.key, body: { userId: narrow.userId, amount: 1_000_000, type: 'TOPUP' } });
    expect(topup.status).toBe(403);
    // Ordinary permissions the caller lacks are refused too; ones it holds are granted.
    expect((await call('platform', 'POST', '/api/admin/api-keys', { key: narrow.key, body: { userId: narrow.userId, permissions: ['inference:use'] } })).status).toBe(403);
    const both = await newUser(['admin:users', 'inference:use']);
    expect((await call('platform', 'POST', '/api/admin/api-keys', { key: both.key, body: { userId: both.userId, permissions: ['inference:use'] } })).status).toBe(201);
  });

  it("changes a key's limits only when the caller holds all of that key's permissions, and never its own (but admin:*)", async () => {
    const narrow = await newUser(['admin:users', 'inference:use']);
    const weaker = await newUser(['inference:use']);
    const stronger = await newUser(['admin:wallets']);
    const patch = (keyId: string) =>
      call('platform', 'PATCH', `/api/admin/api-keys/${keyId}`, { key: narrow.key, body: { rateLimits: { requestsPerMinute: 1_000_000 } } });
    expect((await patch(weaker.keyId)).status).toBe(200);
    const up = await patch(stronger.keyId);
    expect(up.status).toBe(403);
    expect(up.body.errors[0]).toMatchObject({ param: 'keyId' });
    expect(up.body.errors[0].details).toContain('admin:wallets');
    expect((await patch(narrow.keyId)).status).toBe(403);
    // The bootstrap admin:* key may change any key.
    expect((await call('platform', 'PATCH', `/api/admin/api-keys/${stronger.keyId}`, { body: { rateLimits: null } })).status).toBe(200);
  });
});
