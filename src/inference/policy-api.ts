import type { Ctx } from '../http/context.js';
import type { ServedModel, TokenUsage } from './engine-api.js';

// The gateway policies every inference request passes (rate limits, quota,
// team billing): admitted before any model work, settled with the real usage.

export interface Admission {
  /** Rate-limit headers for the answer, known at admission (before a stream starts). */
  headers: Record<string, string>;
  /** Called exactly once when the request ends (finished, failed or cancelled). */
  settle(usage: TokenUsage): void;
}

export interface Policies {
  /**
   * The payer's checks alone (team membership, wallet balance, run), from caches:
   * run before tokenising a prompt, so that an empty wallet costs the daemon nothing.
   */
  check(ctx: Ctx): Promise<void>;
  admit(ctx: Ctx, model: ServedModel, reservedTokens: number): Promise<Admission>;
  /** Requests that do no model work (model listing): the request limit only; returns the headers. */
  admitLight(ctx: Ctx): Promise<Record<string, string>>;
}
