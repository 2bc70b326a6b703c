import { notFound } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { iso } from '../format.js';
import type { Page } from '../http/query.js';
import { isMember, teamsOf } from '../auth/membership.js';

// Teams as the caller sees them (SPEC 4.4) and the membership checks other
// platform files share. Teams, members and roles are issued by the admin routes.


/** The subset of `userIds` that are members of the team. */
export async function membersAmong(sql: Sql | Tx, teamId: string, userIds: string[]): Promise<Set<string>> {
  const rows = await sql<{ user_id: string }[]>`SELECT user_id FROM team_members WHERE team_id = ${teamId} AND user_id = ANY(${userIds})`;
  return new Set(rows.map((r) => r.user_id));
}

export async function myTeams(sql: Sql, userId: string, page: Page) {
  const rows = await sql<{ team_id: string; name: string; slug: string; role: string; joined_at: Date; total_count: number }[]>`
    SELECT m.team_id, t.name, t.slug, m.role, m.joined_at, count(*) OVER ()::int AS total_count
    FROM team_members m JOIN teams t ON t.id = m.team_id
    WHERE m.user_id = ${userId}
    ORDER BY m.joined_at, m.team_id
    LIMIT ${page.limit} OFFSET ${page.offset}`;
  const total = rows[0]?.total_count ?? (await countOf(sql`SELECT count(*)::int AS n FROM team_members WHERE user_id = ${userId}`));
  return {
    total_count: total,
    offset: page.offset,
    limit: page.limit,
    data: rows.map((r) => ({ teamId: r.team_id, name: r.name, slug: r.slug, role: r.role, createdAt: iso(r.joined_at) })),
  };
}

/** Members of a team the caller belongs to; any other team answers 404 (its id is not revealed). */
export async function teamMembers(sql: Sql, teamId: string, callerId: string, page: Page) {
  if (!(await isMember(sql, teamId, callerId))) throw notFound('team', teamId);
  const rows = await sql<{ user_id: string; name: string; email: string; role: string; joined_at: Date; total_count: number }[]>`
    SELECT m.user_id, u.name, u.email, m.role, m.joined_at, count(*) OVER ()::int AS total_count
    FROM team_members m JOIN users u ON u.id = m.user_id
    WHERE m.team_id = ${teamId}
    ORDER BY m.joined_at, m.user_id
    LIMIT ${page.limit} OFFSET ${page.offset}`;
  const total = rows[0]?.total_count ?? (await countOf(sql`SELECT count(*)::int AS n FROM team_members WHERE team_id = ${teamId}`));
  return {
    total_count: total,
    offset: page.offset,
    limit: page.limit,
    data: rows.map((r) => ({ userId: r.user_id, userName: r.name, userEmail: r.email, role: r.role, joinedAt: iso(r.joined_at) })),
  };
}

async function countOf(q: PromiseLike<{ n: number }[]>): Promise<number> {
  const [r] = await q;
  return r?.n ?? 0;
}

/**
 * Admin listing of a user's teams (SPEC 4.7), limited to teams the caller may
 * read: `admin:*` reads every team; a narrower admin key (admin:users) reads
 * only teams its own user is also a member of.
 */
export async function adminUserTeams(sql: Sql, userId: string, caller: { userId: string; all: boolean }) {
  const [u] = await sql`SELECT 1 FROM users WHERE id = ${userId}`;
  if (!u) throw notFound('user', userId);
  const rows = await sql<{ id: string; name: string; created_at: Date; slug: string; email: string | null; has_beta_access: boolean }[]>`
    SELECT t.id, t.name, t.created_at, t.slug, t.email, t.has_beta_access
    FROM team_members m JOIN teams t ON t.id = m.team_id
    WHERE m.user_id = ${userId}
      ${caller.all ? sql`` : sql`AND t.id IN (${teamsOf(sql, caller.userId)})`}
    ORDER BY t.created_at, t.id`;
  return rows.map((t) => ({ id: t.id, name: t.name, createdAt: iso(t.created_at), slug: t.slug, email: t.email, hasBetaAccess: t.has_beta_access }));
}
