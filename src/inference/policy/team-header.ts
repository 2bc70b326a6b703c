import { invalid } from '../../errors.js';
import type { Ctx } from '../../http/context.js';

/** Our header (SPEC) and Prime's own (its CLI's inference client and prime-traces send it). */
export const TEAM_HEADER = 'x-service-team-id';
export const PRIME_TEAM_HEADER = 'x-prime-team-id';

/**
 * The team a request asks to be billed to, from either header: the same team
 * named twice is one request for it; two different teams is ambiguous, so it is
 * refused (400) instead of picking one and billing a wallet the caller did not mean.
 * Membership is checked by the caller, the same way for both names.
 */
export function requestedTeam(ctx: Pick<Ctx, 'header'>): { teamId: string; header: string } | null {
  const ours = ctx.header(TEAM_HEADER)?.trim() || null;
  const prime = ctx.header(PRIME_TEAM_HEADER)?.trim() || null;
  if (ours && prime && ours !== prime) {
    throw invalid(PRIME_TEAM_HEADER, `must name the same team as ${TEAM_HEADER} (${JSON.stringify(ours)}) when both are sent`, prime, 'conflicting_team_headers');
  }
  if (ours) return { teamId: ours, header: TEAM_HEADER };
  if (prime) return { teamId: prime, header: PRIME_TEAM_HEADER };
  return null;
}
