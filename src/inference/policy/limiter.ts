import { ApiError } from '../../errors.js';
import { counter } from '../../metrics.js';
import { TokenBucket, formatDuration } from './bucket.js';

export const rateLimitRefusals = counter({
  name: 'inference_rate_limit_refusals_total',
  help: 'Inference requests refused with 429 by a rate limit, by limit kind',
  labelNames: ['limit'],
}, 'inference');

export interface Limits {
  requestsPerMinute: number;
  tokensPerMinute: number;
}

interface Pair {
  requests: TokenBucket;
  tokens: TokenBucket;
}

/** What the policies admit through: the in-process buckets, or Redis's (redis-limiter.ts). */
export interface Limiter {
  admit(scopes: Array<{ key: string; limits: Limits }>, tokens: number): Grant | Promise<Grant>;
}

export interface Grant {
  headers: Record<string, string>;
  /** Returns unused reserved tokens (reserved - used) to the buckets. */
  release(usedTokens: number): void;
}

// Buckets idle this long are dropped (they are full again by then anyway).
const IDLE_BUCKET_MS = 5 * 60_000;

/**
 * Requests and tokens per minute, per API key and per (key, model). A request
 * reserves its prompt plus max_tokens at admission; the unused part comes back
 * when it ends. Limits of 0 mean unlimited.
 */
export class RateLimiter {
  private readonly buckets = new Map<string, Pair & { limits: Limits; usedAt: number }>();
  private sweptAt = 0;

  constructor(private readonly clock: () => number = Date.now) {}

  private pair(key: string, limits: Limits, now: number): Pair {
    let p = this.buckets.get(key);
    if (!p || p.limits.requestsPerMinute !== limits.requestsPerMinute || p.limits.tokensPerMinute !== limits.tokensPerMinute) {
      p = {
        limits,
        requests: new TokenBucket(limits.requestsPerMinute || Infinity, now),
        tokens: new TokenBucket(limits.tokensPerMinute || Infinity, now),
        usedAt: now,
      };
      this.buckets.set(key, p);
    }
    p.usedAt = now;
    return p;
  }

  admit(scopes: Array<{ key: string; limits: Limits }>, tokens: number): Grant {
    const now = this.clock();
    this.sweep(now);
    const pairs = scopes.map((s) => ({ ...s, pair: this.pair(s.key, s.limits, now) }));
    for (const { pair, limits } of pairs) {
      const reqWait = pair.requests.waitMs(1, now);
      const tokWait = pair.tokens.waitMs(tokens, now);
      if (reqWait > 0 || tokWait > 0) {
        const which = reqWait >= tokWait ? 'requests' : 'tokens';
        rateLimitRefusals.inc({ limit: which });
        const wait = Math.max(reqWait, tokWait);
        const headers = this.headers(pair, now);
        if (!Number.isFinite(wait)) {
          throw new ApiError('rate_limited', `this request needs ${tokens} tokens, more than the limit of ${limits.tokensPerMinute} tokens per minute; lower max_tokens`, {
            param: 'max_tokens',
            code: 'rate_limit_exceeded',
            headers,
            retryAfterMs: 60_000,
          });
        }
        const rule = which === 'requests' ? `${limits.requestsPerMinute} requests per minute` : `${limits.tokensPerMinute} tokens per minute`;
        throw new ApiError('rate_limited', `rate limit of ${rule} exceeded; retry in ${formatDuration(wait)}`, {
          code: 'rate_limit_exceeded',
          headers,
          retryAfterMs: wait,
        });
      }
    }
    for (const { pair } of pairs) {
      pair.requests.take(1, now);
      pair.tokens.take(tokens, now);
    }
    // The headers describe the tightest scope: the first (the key's own limits).
    const headers = this.headers(pairs[0]!.pair, now);
    let released = false;
    return {
      headers,
      release: (used: number) => {
        if (released) return;
        released = true;
        const back = tokens - used;
        if (back > 0) for (const { pair } of pairs) pair.tokens.give(back, this.clock());
      },
    };
  }

  private headers(p: Pair, now: number): Record<string, string> {
    const lim = (b: TokenBucket) => (Number.isFinite(b.capacity) ? String(b.capacity) : '0');
    const rem = (b: TokenBucket) => (Number.isFinite(b.capacity) ? String(b.remaining(now)) : '0');
    const reset = (b: TokenBucket) => (Number.isFinite(b.capacity) ? formatDuration(b.resetMs(now)) : '0s');
    return {
      'x-ratelimit-limit-requests': lim(p.requests),
      'x-ratelimit-limit-tokens': lim(p.tokens),
      'x-ratelimit-remaining-requests': rem(p.requests),
      'x-ratelimit-remaining-tokens': rem(p.tokens),
      'x-ratelimit-reset-requests': reset(p.requests),
      'x-ratelimit-reset-tokens': reset(p.tokens),
    };
  }

  private sweep(now: number): void {
    if (now - this.sweptAt < IDLE_BUCKET_MS) return;
    this.sweptAt = now;
    for (const [k, p] of this.buckets) if (now - p.usedAt > IDLE_BUCKET_MS) this.buckets.delete(k);
  }
}
