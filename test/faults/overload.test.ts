import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fundedKey, startDaemon, stopDaemon, type Started } from '../daemon.js';

// Issue 12.6: admission by work. A request is admitted only if it would start within
// ADMISSION_WAIT_MS_MAX (work queued over the measured rate); the rest get a fast 429
// with a Retry-After taken from the queue, instead of waiting a minute for a slot.

const CHAT = 'cloudgate/random-llama-chat';
const FLOOD = 120;
// 64 slots x 200 tokens is seconds of work here: far past a 500 ms admission bound.
const body = { model: CHAT, messages: [{ role: 'user', content: 'a story please' }], max_tokens: 200, temperature: 0, logit_bias: { '2': -100 } };

let d: Started;
let key: string;
beforeAll(async () => {
  d = await startDaemon({ ADMISSION_WAIT_MS_MAX: '500' });
  key = (await fundedKey(d, 10_000_000, ['inference:use'], { requestsPerMinute: 100_000, tokensPerMinute: 100_000_000 })).key;
}, 60_000);
afterAll(async () => {
  if (d) await stopDaemon(d);
});

const chat = async () => {
  const t0 = performance.now();
  const r = await fetch(`${d.inferenceUrl}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const b = (await r.json()) as { error?: { code: string; message: string } };
  return { status: r.status, ms: performance.now() - t0, retryAfter: r.headers.get('retry-after'), body: b };
};

describe('overload', () => {
  it('admits by estimated work: refuses the excess fast with Retry-After, serves the admitted', async () => {
    // One request first: the engine's rate is measured from real steps.
    expect((await chat()).status).toBe(200);
    const all = await Promise.all(Array.from({ length: FLOOD }, chat));
    const ok = all.filter((r) => r.status === 200);
    const refused = all.filter((r) => r.status === 429);
    expect(ok.length + refused.length).toBe(FLOOD);
    expect(ok.length).toBeGreaterThan(0);
    expect(refused.length).toBeGreaterThan(0);
    for (const r of refused) {
      expect(r.body.error!.code).toBe('engine_overloaded');
      expect(r.body.error!.message).toMatch(/would wait/);
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
    }
    // Refusals are answered without waiting on the queue (the admitted take seconds).
    const slowestRefusal = Math.max(...refused.map((r) => r.ms));
    const slowestServed = Math.max(...ok.map((r) => r.ms));
    expect(slowestRefusal).toBeLessThan(slowestServed);
  }, 60_000);
});
