import { describe, expect, it } from 'vitest';
import { CompletionRate } from './throughput.js';

describe('completion rate', () => {
  it('is unknown before a few requests ended, then follows the recent rate of endings', () => {
    const r = new CompletionRate();
    const t0 = performance.now();
    expect(r.perSecond(t0)).toBeUndefined();
    r.note(t0 + 10);
    expect(r.perSecond(t0 + 20)).toBeUndefined();
    for (let i = 1; i <= 100; i++) r.note(t0 + i * 250); // 4 per second for 25 s
    expect(r.perSecond(t0 + 25_000)).toBeGreaterThan(3.5);
    expect(r.perSecond(t0 + 25_000)).toBeLessThan(4.5);
  });

  it('says nothing once endings stopped long enough: no start can be promised then', () => {
    const r = new CompletionRate();
    const t0 = performance.now();
    for (let i = 1; i <= 40; i++) r.note(t0 + i * 250);
    expect(r.perSecond(t0 + 10_000)).toBeGreaterThan(3);
    expect(r.perSecond(t0 + 10_000 + 60_000)).toBeUndefined();
  });
});
