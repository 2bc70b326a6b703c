import { ApiError } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { walletOf } from '../money/ledger.js';
import { isMember, teamsOf } from '../auth/membership.js';

// Who may see a disk, which attachments hold one, and whose wallet pays for a
// new pod or disk: the rules pods.ts and disks.ts share.

/** A disk the caller may see: their own, or one of a team they belong to. */
export const diskVisible = (sql: Sql | Tx, userId: string) =>
  sql`(d.user_id = ${userId} OR d.team_id IN (${teamsOf(sql, userId)}))`;

/** Attachments that still hold the disk: live, or detaching after their pod ended. */
export const holdsDisk = (sql: Sql | Tx) => sql`(pd.detached_at IS NULL OR pd.detached_at > clock_timestamp())`;

/** Whose wallet pays: the team's when a team is named (caller must belong to it), else the caller's. */
export async function payer(sql: Sql, userId: string, teamId: string | null | undefined, param: string) {
  if (teamId) {
    if (!(await isMember(sql, teamId, userId))) {
      throw new ApiError('forbidden', `${param}: you are not a member of team ${JSON.stringify(teamId)}`, { param });
    }
    return { teamId, walletId: await walletOf(sql, { teamId }) };
  }
  return { teamId: null, walletId: await walletOf(sql, { userId }) };
}

