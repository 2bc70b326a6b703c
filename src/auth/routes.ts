import type { Sql } from '../db/index.js';
import { parse } from '../http/validate.js';
import { adminEnvelope, routeDoc as doc, type Route } from '../http/router.js';
import type { Authenticator } from './authenticator.js';
import { AddMemberBody, ApiKey, ApiKeyList, CreateKeyBody, CreateTeamBody, CreateUserBody, IssuedKey, KeyRateLimitsSet, Membership, PatchKeyBody, Team, User } from './protocol.js';
import { addMember, assertGrantable, createApiKey, createTeam, createUser, listApiKeys, revokeApiKey, setKeyRateLimits } from './issuance.js';

// Admin issuance routes. Each answers `{data, status}` like the other admin routes.
export function issuanceRoutes(sql: Sql, auth: Authenticator): Route[] {
  const ok = (data: unknown) => ({ status: 201, body: { data, status: 'success' } });
  const base = { method: 'POST' as const, family: 'platform' as const, auth: 'admin:users' as const };
  return [
    {
      ...base,
      path: '/api/admin/users',
      doc: doc('admin', 'Creates a user with a personal wallet', { 201: adminEnvelope(User) }, { body: CreateUserBody }),
      handler: async (ctx) => {
        const b = parse(CreateUserBody, await ctx.json());
        return ok(await createUser(sql, b.name, b.email));
      },
    },
    {
      ...base,
      path: '/api/admin/teams',
      doc: doc('admin', 'Creates a team with its wallet', { 201: adminEnvelope(Team) }, { body: CreateTeamBody }),
      handler: async (ctx) => {
        const b = parse(CreateTeamBody, await ctx.json());
        return ok(await createTeam(sql, b.name, b.slug, b.email));
      },
    },
    {
      ...base,
      path: '/api/admin/teams/:teamId/members',
      doc: doc('admin', 'Adds a user to a team', { 201: adminEnvelope(Membership) }, { body: AddMemberBody }),
      handler: async (ctx) => {
        const b = parse(AddMemberBody, await ctx.json());
        return ok(await addMember(sql, ctx.params.teamId!, b.userId, b.role));
      },
    },
    {
      ...base,
      path: '/api/admin/api-keys',
      doc: doc('admin', 'Issues an API key (only permissions the caller holds); the secret is shown once', { 201: adminEnvelope(IssuedKey) }, { body: CreateKeyBody }),
      handler: async (ctx) => {
        const b = parse(CreateKeyBody, await ctx.json());
        assertGrantable(ctx.principal, b.permissions);
        return ok(await createApiKey(sql, b.userId, b.permissions, b.name, b.rateLimits));
      },
    },
    {
      // A key's own rate limits, changed in place. This daemon uses them from the next request;
      // other daemons on the database within a notification's delay (migration 002).
      ...base,
      method: 'PATCH',
      path: '/api/admin/api-keys/:keyId',
      doc: doc('admin', "Sets a key's own rate limits (null: the defaults)", { 200: adminEnvelope(KeyRateLimitsSet) }, { body: PatchKeyBody }),
      handler: async (ctx) => {
        const b = parse(PatchKeyBody, await ctx.json());
        const r = await setKeyRateLimits(sql, ctx.principal, ctx.params.keyId!, b.rateLimits);
        auth.invalidate();
        return { status: 200, body: { data: r, status: 'success' } };
      },
    },
    {
      // Revoke (the row is kept with its revocation time). Only by a caller holding all of the key's permissions.
      ...base,
      method: 'DELETE',
      path: '/api/admin/api-keys/:keyId',
      doc: doc('admin', 'Revokes a key', { 200: adminEnvelope(ApiKey) }),
      handler: async (ctx) => {
        const r = await revokeApiKey(sql, ctx.principal, ctx.params.keyId!);
        auth.invalidate();
        return { status: 200, body: { data: r, status: 'success' } };
      },
    },
    {
      // A user's keys without their secrets.
      ...base,
      method: 'GET',
      path: '/api/admin/users/:userId/api-keys',
      doc: doc('admin', "A user's keys, without their secrets", { 200: adminEnvelope(ApiKeyList) }),
      handler: async (ctx) => ({ status: 200, body: { data: await listApiKeys(sql, ctx.params.userId!), status: 'success' } }),
    },
  ];
}
