import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../errors.js';
import { RateLimiter } from './limiter.js';
import { REDIS_RETRY_MS, RedisRateLimiter } from './redis-limiter.js';

// Against the Redis service (127.0.0.1:6379) under this run's own key prefix; skipped with a
// message when none answers. Two limiters on one Redis stand for two replicas.

const REDIS_URL = process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `cgtest:${randomBytes(6).toString('hex')}:`;

async function reachable(): Promise<boolean> {
  const r = new Redis(REDIS_URL, { lazyConnect: true, connectTimeout: 500, maxRetriesPerRequest: 0, retryStrategy: () => null });
  r.on('error', () => {});
  try {
    await r.connect();
    await r.ping();
    return true;
  } catch {
    return false;
  } finally {
    r.disconnect();
  }
}
const up = await reachable();
if (!up) console.warn(`redis-limiter tests skipped: no Redis answers at ${REDIS_URL}`);

const limits = (requestsPerMinute: number, tokensPerMinute = 0) => ({ requestsPerMinute, tokensPerMinute });
const make = (url = REDIS_URL, timeoutMs = 200) => new RedisRateLimiter({ url, prefix, timeoutMs }, new RateLimiter());
const status = (p: Promise<unknown>) => p.then(() => 200, (e) => (e instanceof ApiError && e.kind === 'rate_limited' ? 429 : Promise.reject(e)));

describe.skipIf(!up)('Redis rate limiter', () => {
  const replicas: RedisRateLimiter[] = [];
  beforeAll(async () => {
    replicas.push(make(), make(), make());
    expect(await Promise.all(replicas.map((l) => l.ready(2_000)))).toEqual([true, true, true]);
  });
  afterAll(async () => {
    const r = new Redis(REDIS_URL);
    const keys = await r.keys(`${prefix}*`);
    if (keys.length) await r.del(...keys);
    r.disconnect();
    await Promise.all(replicas.map((l) => l.close()));
  });

  it('admits exactly a key\'s limit across replicas, concurrently', async () => {
    const scope = [{ key: 'k-exact', limits: limits(60) }];
    const all = await Promise.all(Array.from({ length: 150 }, (_, i) => status(replicas[i % 3]!.admit(scope, 0))));
    expect(all.filter((s) => s === 200).length).toBe(60);
    expect(all.filter((s) => s === 429).length).toBe(90);
  });

  it('writes the in-process limiter\'s headers and refusals for the same sequence', async () => {
    const local = new RateLimiter();
    const scope = [{ key: 'k-headers', limits: limits(3, 1000) }];
    for (const tokens of [100, 400, 400]) {
      const a = await replicas[0]!.admit(scope, tokens);
      const b = local.admit(scope, tokens);
      expect(a.headers['x-ratelimit-remaining-requests']).toBe(b.headers['x-ratelimit-remaining-requests']);
      expect(a.headers['x-ratelimit-limit-tokens']).toBe('1000');
      // Refill between the two calls is a few tokens at most.
      expect(Math.abs(Number(a.headers['x-ratelimit-remaining-tokens']) - Number(b.headers['x-ratelimit-remaining-tokens']))).toBeLessThanOrEqual(2);
    }
    const e = await replicas[1]!.admit(scope, 1).catch((x) => x);
    expect(e).toBeInstanceOf(ApiError);
    expect(e.message).toMatch(/rate limit of 3 requests per minute exceeded; retry in \d+(ms|s)/);
    expect(e.headers['x-ratelimit-remaining-requests']).toBe('0');
    // Over the token capacity: never admissible, named as max_tokens.
    const big = await replicas[2]!.admit([{ key: 'k-big', limits: limits(10, 500) }], 501).catch((x) => x);
    expect(big.param).toBe('max_tokens');
  });

  it('gives unused tokens back, on every replica', async () => {
    const scope = [{ key: 'k-give', limits: limits(100, 1000) }];
    const g = await replicas[0]!.admit(scope, 900);
    expect(await status(replicas[1]!.admit(scope, 900))).toBe(429);
    g.release(100);
    // The give-back is sent after the answer; the next admission on another replica sees it.
    await new Promise((r) => setTimeout(r, 50));
    expect(await status(replicas[2]!.admit(scope, 700))).toBe(200);
  });

  it('answers within its timeout when Redis is slow (paused), then goes back to Redis', async () => {
    const l = make(REDIS_URL, 50);
    const admin = new Redis(REDIS_URL);
    try {
      expect(await l.ready(2_000)).toBe(true);
      const scope = [{ key: 'k-slow', limits: limits(100) }];
      await l.admit(scope, 0);
      // Writes (and so the admission script) wait 400 ms on the server.
      await admin.call('CLIENT', 'PAUSE', '400', 'WRITE');
      const t0 = performance.now();
      expect(await status(l.admit(scope, 0))).toBe(200);
      const took = performance.now() - t0;
      expect(took).toBeGreaterThanOrEqual(45);
      expect(took).toBeLessThan(300);
      // After the pause and the retry interval, admissions count in Redis again (seen by another replica).
      await new Promise((r) => setTimeout(r, REDIS_RETRY_MS + 500));
      await l.admit(scope, 0);
      const before = Number((await replicas[0]!.admit(scope, 0)).headers['x-ratelimit-remaining-requests']);
      await l.admit(scope, 0);
      const after = Number((await replicas[0]!.admit(scope, 0)).headers['x-ratelimit-remaining-requests']);
      expect(after).toBe(before - 2);
    } finally {
      admin.disconnect();
      await l.close();
    }
  });

  it('falls back to in-process limits when Redis is unreachable or silent, within its timeout', async () => {
    // Unreachable: nothing listens on the port.
    const dead = make('redis://127.0.0.1:1', 50);
    // Silent: accepts the connection, never answers.
    const silent = net.createServer(() => {});
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    const port = (silent.address() as net.AddressInfo).port;
    const mute = make(`redis://127.0.0.1:${port}`, 50);
    try {
      for (const l of [dead, mute]) {
        const scope = [{ key: 'k-fallback', limits: limits(2) }];
        const t0 = performance.now();
        const results = [await status(l.admit(scope, 0)), await status(l.admit(scope, 0)), await status(l.admit(scope, 0))];
        expect(performance.now() - t0).toBeLessThan(1_000);
        expect(results).toEqual([200, 200, 429]);
      }
    } finally {
      await dead.close();
      await mute.close();
      silent.close();
    }
  });
});
