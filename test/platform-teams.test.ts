import { describe, expect, it } from 'vitest';
import { addMember, newTeam, newUser } from './helpers.js';
import { get } from './platform-helpers.js';

describe('teams', () => {
  it('lists the caller\'s memberships with role and join time, paginated', async () => {
    const u = await newUser(['teams:read']);
    const [t1, t2, t3] = [await newTeam(), await newTeam(), await newTeam()];
    await addMember(t1.id, u.userId, 'ADMIN');
    await addMember(t2.id, u.userId, 'MEMBER');
    await addMember(t3.id, u.userId);
    const r = await get(u.key, '/api/v1/user/teams');
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ total_count: 3, offset: 0, limit: 100 });
    expect(r.body.data.map((m: any) => m.teamId)).toEqual([t1.id, t2.id, t3.id]);
    expect(r.body.data[0]).toEqual({ teamId: t1.id, name: t1.name, slug: t1.slug, role: 'ADMIN', createdAt: expect.any(String) });
    expect(r.body.data[1].role).toBe('MEMBER');
    const page = await get(u.key, '/api/v1/user/teams/?offset=1&limit=1');
    expect(page.body).toMatchObject({ total_count: 3, offset: 1, limit: 1 });
    expect(page.body.data.map((m: any) => m.teamId)).toEqual([t2.id]);
    expect((await get(u.key, '/api/v1/user/teams?offset=5')).body).toMatchObject({ total_count: 3, data: [] });
    for (const qs of ['limit=0', 'limit=1001', 'offset=-1']) expect((await get(u.key, `/api/v1/user/teams?${qs}`)).status, qs).toBe(422);
    const loner = await newUser(['teams:read']);
    expect((await get(loner.key, '/api/v1/user/teams')).body).toEqual({ total_count: 0, offset: 0, limit: 100, data: [] });
  });

  it('lists a team\'s members to its members only', async () => {
    const [a, b, outsider] = [await newUser(['teams:read']), await newUser(['teams:read']), await newUser(['teams:read'])];
    const t = await newTeam();
    await addMember(t.id, a.userId, 'ADMIN');
    await addMember(t.id, b.userId);
    const r = await get(b.key, `/api/v1/teams/${t.id}/members`);
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ total_count: 2, offset: 0, limit: 100 });
    expect(r.body.data[0]).toEqual({ userId: a.userId, userName: expect.any(String), userEmail: expect.stringContaining('@'), role: 'ADMIN', joinedAt: expect.any(String) });
    expect(r.body.data[1]).toMatchObject({ userId: b.userId, role: 'MEMBER' });
    const page = await get(b.key, `/api/v1/teams/${t.id}/members?limit=1&offset=1`);
    expect(page.body.data.map((m: any) => m.userId)).toEqual([b.userId]);
    expect((await get(outsider.key, `/api/v1/teams/${t.id}/members`)).status).toBe(404);
    expect((await get(a.key, '/api/v1/teams/no-such-team/members')).status).toBe(404);
  });

  it('needs teams:read', async () => {
    const u = await newUser(['instances:read']);
    expect((await get(u.key, '/api/v1/user/teams')).status).toBe(403);
  });
});
