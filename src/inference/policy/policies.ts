import { ApiError } from '../../errors.js';
import type { Sql } from '../../db/index.js';
import { runVisibleTo } from '../../money/rft.js';
import type { Ctx } from '../../http/context.js';
import type { ServedModel } from '../engine-api.js';
import type { TokenUsage } from '../engine-api.js';
import type { Admission, Policies } from '../policy-api.js';
import type { Charger } from './charger.js';
import type { Limiter, Limits } from './limiter.js';
import { requestedTeam } from './team-header.js';
import { isMember } from '../../auth/membership.js';
import { TtlCache } from '../../cache.js';
import { unitsToUsd } from '../../money/ledger.js';

// A wallet's balance is re-read at most this often per wallet: the 402 check
// costs no DB round trip per request, and a wallet that runs dry is refused
// within a second. Team membership (and so RFT run access) changes take effect within 10 s.
const BALANCE_CACHE_MS = 1_000;
const MEMBERSHIP_CACHE_MS = 10_000;
// Bounded caches: a flood of distinct teams or wallets cannot grow memory.
const CACHE_ENTRIES_MAX = 50_000;

export class GatewayPolicies implements Policies {
  private readonly balances = new TtlCache<number>(BALANCE_CACHE_MS, CACHE_ENTRIES_MAX);
  private readonly members = new TtlCache<boolean>(MEMBERSHIP_CACHE_MS, CACHE_ENTRIES_MAX);
  private readonly wallets = new TtlCache<string | null>(Infinity, CACHE_ENTRIES_MAX);
  private readonly runs = new TtlCache<boolean>(MEMBERSHIP_CACHE_MS, CACHE_ENTRIES_MAX);

  constructor(
    private readonly sql: Sql,
    private readonly limiter: Limiter,
    private readonly charger: Charger,
    private readonly defaults: Limits,
    private readonly clock: () => number = Date.now,
  ) {}

  /** Called by the charger after it posted units, so the cached balance follows. */
  posted(walletId: string, units: number): void {
    this.balances.adjust(walletId, (b) => b - units);
  }

  private limitsOf(ctx: Ctx): Limits {
    const p = ctx.principal;
    return {
      requestsPerMinute: p.rateLimits?.requestsPerMinute ?? this.defaults.requestsPerMinute,
      tokensPerMinute: p.rateLimits?.tokensPerMinute ?? this.defaults.tokensPerMinute,
    };
  }

  async admitLight(ctx: Ctx): Promise<Record<string, string>> {
    return (await this.limiter.admit([{ key: ctx.principal.keyId, limits: this.limitsOf(ctx) }], 0)).headers;
  }

  /** Whether the user may attribute usage to the run; like memberships, only a yes is cached. */
  private async runVisible(runId: string, userId: string, now: number): Promise<boolean> {
    const key = `${runId}\u0000${userId}`;
    const yes = await this.runs.get(key, () => runVisibleTo(this.sql, runId, userId), undefined, now);
    if (!yes) this.runs.delete(key);
    return yes;
  }

  async check(ctx: Ctx): Promise<void> {
    await this.payer(ctx);
  }

  /** Who pays (team header, wallet, balance) and the run the usage counts against; every answer but a yes cached. */
  private async payer(ctx: Ctx): Promise<{ walletId: string; teamId: string | null; runId: string | null }> {
    const p = ctx.principal;
    const now = this.clock();
    const team = requestedTeam(ctx);
    const teamId = team?.teamId ?? null;
    if (team && teamId) {
      // Only memberships are cached: a user just added to a team is let in on the next request.
      const key = `${teamId}\u0000${p.userId}`;
      const member = await this.members.get(key, () => isMember(this.sql, teamId, p.userId), undefined, now);
      if (!member) this.members.delete(key);
      if (!member) {
        throw new ApiError('forbidden', `${team.header} names team ${JSON.stringify(teamId)}, which this API key's user is not a member of`, {
          param: team.header,
          code: 'team_access_denied',
        });
      }
    }
    if (teamId) ctx.note({ team: teamId });
    const ownerKey = teamId ? `t:${teamId}` : `u:${p.userId}`;
    const walletId = await this.wallets.get(ownerKey, async () => {
      const r = teamId
        ? await this.sql<{ id: string }[]>`SELECT id FROM wallets WHERE team_id = ${teamId}`
        : await this.sql<{ id: string }[]>`SELECT id FROM wallets WHERE user_id = ${p.userId}`;
      return r[0]?.id ?? null;
    }, undefined, now);
    if (!walletId) throw new ApiError('payment_required', 'no wallet is attached to this account', { code: 'insufficient_quota' });
    const balance = await this.balances.get(walletId, async () => {
      const r = await this.sql<{ balance: number }[]>`SELECT balance FROM wallets WHERE id = ${walletId}`;
      return r[0]?.balance ?? 0;
    }, undefined, now);
    if (balance <= 0) {
      throw new ApiError(
        'payment_required',
        `the ${teamId ? 'team' : 'personal'} wallet has a balance of ${unitsToUsd(balance).toFixed(4)} USD; top it up to use inference`,
        { code: 'insufficient_quota', type: 'insufficient_quota' },
      );
    }
    const runId = ctx.header('x-rft-run-id')?.trim() || null;
    // The header is checked before any model work: tokens counted against a
    // run must come from its owner or its team, never from a stranger.
    if (runId && !(await this.runVisible(runId, p.userId, now))) {
      throw new ApiError('not_found', `X-RFT-Run-ID names run ${JSON.stringify(runId)}, which does not exist or is not this API key's user's (or their team's)`, {
        param: 'x-rft-run-id',
        code: 'run_not_found',
      });
    }
    return { walletId, teamId, runId };
  }

  async admit(ctx: Ctx, model: ServedModel, reservedTokens: number): Promise<Admission> {
    const { walletId, teamId, runId } = await this.payer(ctx);
    const grant = await this.limiter.admit([{ key: `${ctx.principal.keyId}\u0000${model.id}`, limits: this.limitsOf(ctx) }], reservedTokens);
    let settled = false;
    return {
      headers: grant.headers,
      settle: (usage: TokenUsage) => {
        if (settled) return;
        settled = true;
        // Evaluation models bill input tokens only (DESIGN.md "Billing").
        const outputPrice = model.kind === 'evaluation' ? 0 : model.prices.outputPerMTok;
        grant.release(usage.inputTokens + usage.outputTokens);
        if (usage.inputTokens + usage.outputTokens === 0) return;
        this.charger.add({
          walletId,
          teamId,
          model: model.id,
          inputTokens: usage.inputTokens,
          outputTokens: usage.outputTokens,
          inputPricePerMTok: model.prices.inputPerMTok,
          outputPricePerMTok: outputPrice,
          runId,
        });
      },
    };
  }
}
