import { Redis } from 'ioredis';
import { ApiError } from '../../errors.js';
import { counter, gauge } from '../../metrics.js';
import { log } from '../../log.js';
import { WINDOW_MS, formatDuration } from './bucket.js';
import { rateLimitRefusals, type Grant, type Limits, type RateLimiter } from './limiter.js';

// Rate limits shared by every replica: the same token buckets as limiter.ts, kept in
// Redis and changed by one server-side script per admission (one round trip; Redis runs
// a script alone, so the check and the take are atomic across replicas). The script
// reads Redis's clock, so replicas with skewed clocks still agree. The give-back of
// unused tokens is a second script, sent after the answer, off the request's path.
//
// When Redis does not answer within REDIS_TIMEOUT_MS (or is unreachable), the request
// is admitted by this replica's in-process buckets instead (never a hung request, never
// a 500): a warning is logged once per outage, `cloudgate_rate_limit_redis_fallbacks_total`
// counts the admissions, and `cloudgate_rate_limit_redis_up` is 0. While Redis is down
// one admission per REDIS_RETRY_MS tries it again; the first that succeeds brings this
// replica back to the shared buckets. An admission that timed out may still be counted
// in Redis when its script runs late: stricter, never looser.

/** Keys of idle buckets expire after this long (they are full again after one window anyway). */
const BUCKET_TTL_MS = 2 * WINDOW_MS;
/** While Redis is down, how often an admission tries it again instead of going straight to the local buckets. */
export const REDIS_RETRY_MS = 1_000;

const fallbacks = counter({
  name: 'cloudgate_rate_limit_redis_fallbacks_total',
  help: 'Admissions decided by the in-process rate limiter because Redis did not answer in time',
}, 'inference');
const redisUp = gauge({ name: 'cloudgate_rate_limit_redis_up', help: '1 while rate limits are kept in Redis, 0 while this replica falls back to in-process limits' }, 'inference');

// KEYS[i]: one hash per scope (fields r, t: levels; at: ms; rc, tc: the capacities they were made for).
// ARGV: tokens, window ms, ttl ms, then per scope its requests and tokens capacity (0: unlimited).
// Returns {admitted, scope, which, waitMs, r, t, rcap, tcap} where r, t are the levels of
// `scope` (the refused scope, or the first when admitted); waitMs -1 means never (over capacity).
const ADMIT_LUA = `
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local tokens = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local st = {}
for i, key in ipairs(KEYS) do
  local rcap = tonumber(ARGV[2 + 2 * i])
  local tcap = tonumber(ARGV[3 + 2 * i])
  local h = redis.call('HMGET', key, 'r', 't', 'at', 'rc', 'tc')
  local r, t
  if h[1] and tonumber(h[4]) == rcap and tonumber(h[5]) == tcap then
    local dt = math.max(0, now - tonumber(h[3]))
    r = math.min(rcap, tonumber(h[1]) + dt * rcap / window)
    t = math.min(tcap, tonumber(h[2]) + dt * tcap / window)
  else
    r = rcap
    t = tcap
  end
  st[i] = {r, t, rcap, tcap}
  local rw, tw = 0, 0
  if rcap > 0 and r < 1 then rw = math.ceil((1 - r) * window / rcap) end
  if tcap > 0 then
    if tokens > tcap then tw = -1
    elseif t < tokens then tw = math.ceil((tokens - t) * window / tcap) end
  end
  if rw ~= 0 or tw ~= 0 then
    local which = 'requests'
    local wait = rw
    if tw == -1 or tw > rw then which = 'tokens'; wait = tw end
    return {0, i, which, wait, tostring(r), tostring(t), rcap, tcap}
  end
end
for i, key in ipairs(KEYS) do
  local s = st[i]
  if s[3] > 0 then s[1] = s[1] - 1 end
  if s[4] > 0 then s[2] = s[2] - tokens end
  redis.call('HSET', key, 'r', tostring(s[1]), 't', tostring(s[2]), 'at', now, 'rc', s[3], 'tc', s[4])
  redis.call('PEXPIRE', key, ttl)
end
return {1, 1, '', 0, tostring(st[1][1]), tostring(st[1][2]), st[1][3], st[1][4]}
`;

// KEYS: the scopes' hashes; ARGV: tokens to give back. Levels refill from the stored time on the next admission, capped there.
const GIVE_LUA = `
local n = tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  local tc = tonumber(redis.call('HGET', key, 'tc'))
  if tc and tc > 0 then
    local t = tonumber(redis.call('HGET', key, 't'))
    redis.call('HSET', key, 't', tostring(math.min(tc, t + n)))
  end
end
return 1
`;

type AdmitReply = [number, number, string, number, string, string, number, number];

interface ScriptedRedis extends Redis {
  cgAdmit(numKeys: number, ...args: Array<string | number>): Promise<AdmitReply>;
  cgGive(numKeys: number, ...args: Array<string | number>): Promise<number>;
}

export interface RedisLimiterOptions {
  url: string;
  /** Key prefix, so several deployments (or tests) can share one Redis. */
  prefix: string;
  /** How long an admission waits for Redis before the local buckets decide. */
  timeoutMs: number;
}

/** Headers from one scope's levels, as limiter.ts writes them for its buckets. */
function headersOf(r: number, t: number, rcap: number, tcap: number): Record<string, string> {
  const rem = (level: number, cap: number) => (cap > 0 ? String(Math.max(0, Math.floor(level))) : '0');
  const reset = (level: number, cap: number) => (cap > 0 ? formatDuration(Math.ceil(((cap - Math.max(0, level)) * WINDOW_MS) / cap)) : '0s');
  return {
    'x-ratelimit-limit-requests': String(rcap),
    'x-ratelimit-limit-tokens': String(tcap),
    'x-ratelimit-remaining-requests': rem(r, rcap),
    'x-ratelimit-remaining-tokens': rem(t, tcap),
    'x-ratelimit-reset-requests': reset(r, rcap),
    'x-ratelimit-reset-tokens': reset(t, tcap),
  };
}

class RedisTimeout extends Error {}

export class RedisRateLimiter {
  private readonly redis: ScriptedRedis;
  private down = false;
  private retryAt = 0;

  constructor(
    private readonly opts: RedisLimiterOptions,
    private readonly local: RateLimiter,
  ) {
    this.redis = new Redis(opts.url, {
      // Fail fast instead of queueing behind a dead connection; reconnect in the background.
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      connectTimeout: Math.max(1_000, opts.timeoutMs),
      retryStrategy: (times: number) => Math.min(times * 200, 2_000),
      lazyConnect: false,
    }) as ScriptedRedis;
    this.redis.on('error', () => {}); // Reported through the fallback path (one warning per outage).
    this.redis.defineCommand('cgAdmit', { lua: ADMIT_LUA });
    this.redis.defineCommand('cgGive', { lua: GIVE_LUA });
    redisUp.set(1);
  }

  /**
   * Resolves when the connection is ready, or after `waitMs` (start-up goes on with the
   * in-process fallback if Redis is not there yet); so the first admissions do not fall back
   * only because the connection was still being made.
   */
  ready(waitMs: number): Promise<boolean> {
    if (this.redis.status === 'ready') return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.redis.off('ready', ok);
        resolve(false);
      }, waitMs);
      const ok = () => {
        clearTimeout(t);
        resolve(true);
      };
      this.redis.once('ready', ok);
    });
  }

  async admit(scopes: Array<{ key: string; limits: Limits }>, tokens: number): Promise<Grant> {
    const now = Date.now();
    if (this.down && now < this.retryAt) return this.fallback(scopes, tokens);
    const keys = scopes.map((s) => `${this.opts.prefix}rl:${s.key}`);
    const caps = scopes.flatMap((s) => [s.limits.requestsPerMinute, s.limits.tokensPerMinute]);
    let reply: AdmitReply;
    try {
      reply = await this.withTimeout(this.redis.cgAdmit(keys.length, ...keys, tokens, WINDOW_MS, BUCKET_TTL_MS, ...caps));
    } catch (e) {
      this.markDown(e);
      return this.fallback(scopes, tokens);
    }
    if (this.down) {
      this.down = false;
      redisUp.set(1);
      log.warn('rate limits: Redis answers again; limits are shared across replicas again');
    }
    const [admitted, scope, which, wait, r, t, rcap, tcap] = reply;
    const headers = headersOf(Number(r), Number(t), rcap, tcap);
    if (!admitted) {
      const limits = scopes[scope - 1]!.limits;
      rateLimitRefusals.inc({ limit: which });
      if (wait < 0) {
        throw new ApiError('rate_limited', `this request needs ${tokens} tokens, more than the limit of ${limits.tokensPerMinute} tokens per minute; lower max_tokens`, {
          param: 'max_tokens',
          code: 'rate_limit_exceeded',
          headers,
          retryAfterMs: WINDOW_MS,
        });
      }
      const rule = which === 'requests' ? `${limits.requestsPerMinute} requests per minute` : `${limits.tokensPerMinute} tokens per minute`;
      throw new ApiError('rate_limited', `rate limit of ${rule} exceeded; retry in ${formatDuration(wait)}`, {
        code: 'rate_limit_exceeded',
        headers,
        retryAfterMs: wait,
      });
    }
    let released = false;
    return {
      headers,
      release: (used: number) => {
        if (released) return;
        released = true;
        const back = tokens - used;
        if (back <= 0) return;
        // Off the answer's path; a lost give-back only makes the bucket stricter until it refills.
        this.redis.cgGive(keys.length, ...keys, back).catch(() => {});
      },
    };
  }

  private fallback(scopes: Array<{ key: string; limits: Limits }>, tokens: number): Grant {
    fallbacks.inc();
    return this.local.admit(scopes, tokens);
  }

  private markDown(e: unknown): void {
    this.retryAt = Date.now() + REDIS_RETRY_MS;
    if (this.down) return;
    this.down = true;
    redisUp.set(0);
    log.warn({ err: e instanceof Error ? e.message : String(e), timeoutMs: this.opts.timeoutMs }, 'rate limits: Redis did not answer; this replica uses in-process limits until it does');
  }

  private withTimeout<T>(p: Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const t = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new RedisTimeout(`no answer in ${this.opts.timeoutMs} ms`)), this.opts.timeoutMs);
    });
    p.catch(() => {}); // A late failure after the timeout is not unhandled.
    return Promise.race([p, t]).finally(() => clearTimeout(timer));
  }

  async close(): Promise<void> {
    this.redis.disconnect();
  }
}
