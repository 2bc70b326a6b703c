import type { Sql, Tx } from '../db/index.js';

// The one team-membership rule: a user belongs to a team when team_members holds the pair.
// Every check of it (a payer's team, what a user may see through their teams) goes through here.

export async function isMember(sql: Sql | Tx, teamId: string, userId: string): Promise<boolean> {
  const [r] = await sql`SELECT 1 FROM team_members WHERE team_id = ${teamId} AND user_id = ${userId}`;
  return !!r;
}

/** The teams a user belongs to, as a subquery: `x.team_id IN (${teamsOf(sql, userId)})`. */
export const teamsOf = (sql: Sql | Tx, userId: string) => sql`SELECT team_id FROM team_members WHERE user_id = ${userId}`;
