import { describe, expect, it } from 'vitest';
import { TokenBucket, formatDuration } from './bucket.js';
import { RateLimiter } from './limiter.js';
import { ApiError } from '../../errors.js';

describe('TokenBucket on a fake clock', () => {
  it('refills continuously to capacity over one minute', () => {
    const b = new TokenBucket(60, 0);
    b.take(60, 0);
    expect(b.remaining(0)).toBe(0);
    expect(b.waitMs(1, 0)).toBe(1000);
    expect(b.remaining(30_000)).toBe(30);
    expect(b.remaining(120_000)).toBe(60); // never above capacity
    expect(b.resetMs(120_000)).toBe(0);
  });

  it('gives back unused reservations, capped at capacity', () => {
    const b = new TokenBucket(100, 0);
    b.take(80, 0);
    b.give(50, 0);
    expect(b.remaining(0)).toBe(70);
    b.give(500, 0);
    expect(b.remaining(0)).toBe(100);
  });

  it('formats reset durations as OpenAI does', () => {
    expect(formatDuration(250)).toBe('250ms');
    expect(formatDuration(1000)).toBe('1s');
    expect(formatDuration(360_000)).toBe('6m0s');
  });
});

describe('RateLimiter', () => {
  it('refuses the request over the per-minute count with a retry time, then admits after refill', () => {
    let now = 0;
    const rl = new RateLimiter(() => now);
    const scope = [{ key: 'k', limits: { requestsPerMinute: 2, tokensPerMinute: 1000 } }];
    rl.admit(scope, 10);
    const g = rl.admit(scope, 10);
    expect(g.headers['x-ratelimit-remaining-requests']).toBe('0');
    expect(g.headers['x-ratelimit-limit-tokens']).toBe('1000');
    let err: ApiError | undefined;
    try {
      rl.admit(scope, 10);
    } catch (e) {
      err = e as ApiError;
    }
    expect(err?.kind).toBe('rate_limited');
    expect(err?.retryAfterMs).toBe(30_000);
    expect(err?.headers?.['x-ratelimit-remaining-requests']).toBe('0');
    now = 30_000;
    expect(() => rl.admit(scope, 10)).not.toThrow();
  });

  it('reserves prompt plus max_tokens and returns the unused part at the end', () => {
    let now = 0;
    const rl = new RateLimiter(() => now);
    const scope = [{ key: 'k', limits: { requestsPerMinute: 100, tokensPerMinute: 1000 } }];
    const g = rl.admit(scope, 900);
    expect(() => rl.admit(scope, 200)).toThrow(/tokens per minute/);
    g.release(100); // used 100 of the 900 reserved
    g.release(100); // a second release is ignored
    const g2 = rl.admit(scope, 800);
    expect(g2.headers['x-ratelimit-remaining-tokens']).toBe('100');
  });

  it('refuses a single request larger than the whole token limit with a clear message', () => {
    const rl = new RateLimiter(() => 0);
    expect(() => rl.admit([{ key: 'k', limits: { requestsPerMinute: 10, tokensPerMinute: 100 } }], 101)).toThrow(/more than the limit of 100 tokens per minute/);
  });
});
