import type { Sql } from '../db/index.js';
import { parse } from '../http/validate.js';
import { adminEnvelope, platformRoute, routeDoc as doc, type Route } from '../http/router.js';
import type { Authenticator } from './authenticator.js';
import { AddMemberBody, ApiKey, ApiKeyList, CreateKeyBody, CreateTeamBody, CreateUserBody, IssuedKey, KeyRateLimitsSet, Membership, PatchKeyBody, Team, User } from './protocol.js';
import { addMember, assertGrantable, createApiKey, createTeam, createUser, listApiKeys, revokeApiKey, setKeyRateLimits } from './issuance.js';

// Admin issuance routes. Each answers `{data, status}` like the other admin routes.
export function issuanceRoutes(sql: Sql, auth: Authenticator): Route[] {
  const r = platformRoute;
  const ok = (data: unknown, status = 201) => ({ status, body: { data, status: 'success' } });
  return [
    r('POST', '/api/admin/users', 'admin:users', doc('admin', 'Creates a user with a personal wallet', { 201: adminEnvelope(User) }, { body: CreateUserBody }), async (ctx) => {
      const b = parse(CreateUserBody, await ctx.json());
      return ok(await createUser(sql, b.name, b.email));
    }),
    r('POST', '/api/admin/teams', 'admin:users', doc('admin', 'Creates a team with its wallet', { 201: adminEnvelope(Team) }, { body: CreateTeamBody }), async (ctx) => {
      const b = parse(CreateTeamBody, await ctx.json());
      return ok(await createTeam(sql, b.name, b.slug, b.email));
    }),
    r('POST', '/api/admin/teams/:teamId/members', 'admin:users', doc('admin', 'Adds a user to a team', { 201: adminEnvelope(Membership) }, { body: AddMemberBody }), async (ctx) => {
      const b = parse(AddMemberBody, await ctx.json());
      return ok(await addMember(sql, ctx.params.teamId!, b.userId, b.role));
    }),
    r(
      'POST',
      '/api/admin/api-keys',
      'admin:users',
      doc('admin', 'Issues an API key (only permissions the caller holds); the secret is shown once', { 201: adminEnvelope(IssuedKey) }, { body: CreateKeyBody }),
      async (ctx) => {
        const b = parse(CreateKeyBody, await ctx.json());
        assertGrantable(ctx.principal, b.permissions);
        return ok(await createApiKey(sql, b.userId, b.permissions, b.name, b.rateLimits));
      },
    ),
    // A key's own rate limits, changed in place. This daemon uses them from the next request;
    // other daemons on the database within a notification's delay (migration 002).
    r(
      'PATCH',
      '/api/admin/api-keys/:keyId',
      'admin:users',
      doc('admin', "Sets a key's own rate limits (null: the defaults)", { 200: adminEnvelope(KeyRateLimitsSet) }, { body: PatchKeyBody }),
      async (ctx) => {
        const b = parse(PatchKeyBody, await ctx.json());
        const res = await setKeyRateLimits(sql, ctx.principal, ctx.params.keyId!, b.rateLimits);
        auth.invalidate();
        return ok(res, 200);
      },
    ),
    // Revoke (the row is kept with its revocation time). Only by a caller holding all of the key's permissions.
    r('DELETE', '/api/admin/api-keys/:keyId', 'admin:users', doc('admin', 'Revokes a key', { 200: adminEnvelope(ApiKey) }), async (ctx) => {
      const res = await revokeApiKey(sql, ctx.principal, ctx.params.keyId!);
      auth.invalidate();
      return ok(res, 200);
    }),
    // A user's keys without their secrets.
    r('GET', '/api/admin/users/:userId/api-keys', 'admin:users', doc('admin', "A user's keys, without their secrets", { 200: adminEnvelope(ApiKeyList) }), async (ctx) =>
      ok(await listApiKeys(sql, ctx.params.userId!), 200),
    ),
  ];
}
