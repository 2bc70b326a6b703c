import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { RateLimiter, type Limiter } from '../src/inference/policy/limiter.js';
import { RedisRateLimiter } from '../src/inference/policy/redis-limiter.js';

// Admission latency of the rate limiter: in process against Redis (REDIS_URL, default the local
// service), at 1 and 32 admissions in flight, on generous limits (every admission admitted) and one
// key+model scope as the gateway uses. Each cell runs DURATION_MS; reports p50/p99 and admissions/s.
//   npm run build && flock /tmp/cloudgate-bench.lock node dist/bench/ratelimit.js

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const DURATION_MS = Number(process.env.DURATION_MS ?? 3_000);
const prefix = `cgbench:${randomBytes(4).toString('hex')}:`;
const limits = { requestsPerMinute: 1e9, tokensPerMinute: 1e9 };

async function cell(l: Limiter, concurrency: number) {
  const lat: number[] = [];
  const until = performance.now() + DURATION_MS;
  let n = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, w) => {
      const scope = [{ key: `key-${w % 4}\u0000model`, limits }];
      while (performance.now() < until) {
        const t0 = performance.now();
        const g = await l.admit(scope, 100);
        lat.push(performance.now() - t0);
        g.release(40);
        n++;
      }
    }),
  );
  lat.sort((a, b) => a - b);
  const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))]!;
  return { p50: q(0.5), p99: q(0.99), perSecond: (n / DURATION_MS) * 1000 };
}

const local = new RateLimiter();
const redis = new RedisRateLimiter({ url, prefix, timeoutMs: 1_000 }, new RateLimiter());
if (!(await redis.ready(3_000))) throw new Error(`no Redis at ${url}`);
const fmt = (x: number) => x.toFixed(3);
console.log('| c | in-process p50 / p99 ms | Redis p50 / p99 ms | added p99 ms | Redis admissions/s |');
console.log('| --- | --- | --- | --- | --- |');
for (const c of [1, 32]) {
  await cell(redis, c); // warm-up: connection, script cache
  const a = await cell(local, c);
  const b = await cell(redis, c);
  console.log(`| ${c} | ${fmt(a.p50)} / ${fmt(a.p99)} | ${fmt(b.p50)} / ${fmt(b.p99)} | ${fmt(b.p99 - a.p99)} | ${Math.round(b.perSecond)} |`);
}
await redis.close();
const r = new Redis(url);
const keys = await r.keys(`${prefix}*`);
if (keys.length) await r.del(...keys);
r.disconnect();
