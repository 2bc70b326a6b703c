import type { Sql } from '../db/index.js';
import { parse } from '../http/validate.js';
import type { Route } from '../http/router.js';
import { AddMemberBody, CreateKeyBody, CreateTeamBody, CreateUserBody } from './protocol.js';
import { addMember, createApiKey, createTeam, createUser } from './issuance.js';

// Admin issuance routes. Each answers `{data, status}` like the other admin routes.
export function issuanceRoutes(sql: Sql): Route[] {
  const ok = (data: unknown) => ({ status: 201, body: { data, status: 'success' } });
  const base = { method: 'POST' as const, family: 'platform' as const, auth: 'admin:users' };
  return [
    {
      ...base,
      path: '/api/admin/users',
      handler: async (ctx) => {
        const b = parse(CreateUserBody, await ctx.json());
        return ok(await createUser(sql, b.name, b.email));
      },
    },
    {
      ...base,
      path: '/api/admin/teams',
      handler: async (ctx) => {
        const b = parse(CreateTeamBody, await ctx.json());
        return ok(await createTeam(sql, b.name, b.slug, b.email));
      },
    },
    {
      ...base,
      path: '/api/admin/teams/:teamId/members',
      handler: async (ctx) => {
        const b = parse(AddMemberBody, await ctx.json());
        return ok(await addMember(sql, ctx.params.teamId!, b.userId, b.role));
      },
    },
    {
      ...base,
      path: '/api/admin/api-keys',
      handler: async (ctx) => {
        const b = parse(CreateKeyBody, await ctx.json());
        return ok(await createApiKey(sql, b.userId, b.permissions, b.name, b.rateLimits));
      },
    },
  ];
}
