import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimiter } from '../src/inference/policy/limiter.js';
import { RedisRateLimiter } from '../src/inference/policy/redis-limiter.js';
import { startDaemon, stopDaemon, type Started } from './daemon.js';

// A daemon started with REDIS_URL keeps its rate limits in Redis: an admission made by another
// replica on the same Redis and prefix (here a limiter in this process) counts against the same key,
// and the daemon answers with the same headers and 429s. Skipped when no Redis answers.

const REDIS_URL = process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `cgtest:${randomBytes(6).toString('hex')}:`;

async function reachable(): Promise<boolean> {
  const r = new Redis(REDIS_URL, { lazyConnect: true, connectTimeout: 500, maxRetriesPerRequest: 0, retryStrategy: () => null });
  r.on('error', () => {});
  try {
    await r.connect();
    return (await r.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    r.disconnect();
  }
}
const up = await reachable();
if (!up) console.warn(`redis-limits e2e skipped: no Redis answers at ${REDIS_URL}`);

describe.skipIf(!up)('rate limits in Redis (REDIS_URL)', () => {
  let d: Started;
  let other: RedisRateLimiter;
  beforeAll(async () => {
    d = await startDaemon({ REDIS_URL, REDIS_KEY_PREFIX: prefix });
    other = new RedisRateLimiter({ url: REDIS_URL, prefix, timeoutMs: 500 }, new RateLimiter());
    expect(await other.ready(2_000)).toBe(true);
  }, 60_000);
  afterAll(async () => {
    await other?.close();
    if (d) {
      await stopDaemon(d);
      fs.rmSync(d.dataDir, { recursive: true, force: true });
    }
    const r = new Redis(REDIS_URL);
    const keys = await r.keys(`${prefix}*`);
    if (keys.length) await r.del(...keys);
    r.disconnect();
  });

  it('shares a key\'s request limit with another replica, with the x-ratelimit headers and a 429', async () => {
    const post = (path: string, body: unknown, key = d.adminKey) =>
      fetch(d.platformUrl + path, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) }).then((r) => r.json() as Promise<any>);
    const u = await post('/api/admin/users', { name: 'redis user', email: `r-${randomBytes(4).toString('hex')}@test.local` });
    const k = await post('/api/admin/api-keys', { userId: u.data.id, permissions: ['inference:use'], rateLimits: { requestsPerMinute: 5, tokensPerMinute: 100_000 } });
    const models = () => fetch(`${d.inferenceUrl}/v1/models`, { headers: { authorization: `Bearer ${k.data.key}` } });
    const first = await models();
    expect(first.status).toBe(200);
    expect(first.headers.get('x-ratelimit-limit-requests')).toBe('5');
    expect(first.headers.get('x-ratelimit-remaining-requests')).toBe('4');
    // Another replica admits three for the same key (the model listing's scope is the key itself).
    for (let i = 0; i < 3; i++) await other.admit([{ key: k.data.id, limits: { requestsPerMinute: 5, tokensPerMinute: 100_000 } }], 0);
    const last = await models();
    expect(last.status).toBe(200);
    expect(last.headers.get('x-ratelimit-remaining-requests')).toBe('0');
    const refused = await models();
    expect(refused.status).toBe(429);
    expect(((await refused.json()) as any).error.message).toMatch(/rate limit of 5 requests per minute exceeded/);
  });
});
