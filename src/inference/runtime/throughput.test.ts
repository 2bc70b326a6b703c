import { describe, expect, it } from 'vitest';
import { CompletionRate, slotWaitMs, StepPace } from './throughput.js';

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

describe('step pace', () => {
  // A unit of a decode step's work: a row-position, and 256 (ROW_BASE_POSITIONS) more a row.
  const unit = (rows: number, position: number) => rows * (position + 256);

  it('knows nothing before a step was timed, then a step of its batch size by the rows and their mean position', () => {
    const p = new StepPace();
    expect(p.decodeStepMs(4, 100)).toBeUndefined();
    expect(p.promptTokenMs()).toBeUndefined();
    p.decode(4, 4 * 100, 8);
    expect(p.decodeStepMs(4, 100)).toBeCloseTo(8);
    // The same bucket (3-4 rows): fewer rows, longer ones.
    expect(p.decodeStepMs(3, 612)).toBeCloseTo((8 / unit(4, 100)) * unit(3, 612));
    p.prompt(20, 4);
    expect(p.promptTokenMs()).toBeCloseTo(0.2);
  });

  it('takes a larger batch from the nearest smaller one measured (a row costs no less), a smaller one as no longer than the larger', () => {
    const p = new StepPace();
    p.decode(1, 40, 1.2); // one row at position 40
    // 64 rows at position 50 as 64 one-row steps: what a batch saves is not assumed.
    expect(p.decodeStepMs(64, 50)).toBeCloseTo((1.2 / unit(1, 40)) * unit(64, 50));
    p.decode(64, 64 * 50, 20); // measured at 64 rows: a row costs much less there
    expect(p.decodeStepMs(64, 50)).toBeCloseTo(20);
    expect(p.decodeStepMs(64, 356)).toBeCloseTo((20 * (356 + 256)) / (50 + 256));
    // 16 rows: the one-row measure still (the nearest smaller bucket) ...
    expect(p.decodeStepMs(16, 50)).toBeCloseTo((1.2 / unit(1, 40)) * unit(16, 50));
    const q = new StepPace();
    q.decode(64, 64 * 50, 20);
    // ... and with only 64 rows measured, 16 rows at that position take no longer than 64 did.
    expect(q.decodeStepMs(16, 50)).toBeCloseTo(20);
  });

  it('follows its recent steps', () => {
    const p = new StepPace();
    p.decode(8, 800, 8);
    for (let i = 0; i < 200; i++) p.decode(8, 800, 16);
    expect(p.decodeStepMs(8, 100)).toBeCloseTo(16, 1);
  });

  it('is seeded by the warm-up, its batch of rows too', () => {
    const p = new StepPace();
    p.seed({ decodeStepMs: 1.5, decodePosition: 30, promptTokens: 20, promptMs: 5 });
    expect(p.decodeStepMs(1, 30)).toBeCloseTo(1.5);
    expect(p.promptTokenMs()).toBeCloseTo(0.25);
    p.seed({ decodeStepMs: 1.5, decodePosition: 30, promptTokens: 20, promptMs: 5, batch: { rows: 16, stepMs: 6, position: 24 } });
    expect(p.decodeStepMs(16, 24)).toBeCloseTo(6);
    expect(p.decodeStepMs(64, 24)).toBeCloseTo(24);
  });
});

describe('slot wait', () => {
  const work = (decodeMs: number, promptMs = 0) => ({ promptMs, decodeMs });

  it('is nothing with a slot free and no one waiting, else when the queue reaches the request, first come first served', () => {
    expect(slotWaitMs(2, [100], [])).toBe(0);
    expect(slotWaitMs(2, [100, 300], [])).toBe(100);
    // The first slot free (100) goes to the head, which holds it 500 (to 600); the next (300) to the second, to 350.
    expect(slotWaitMs(2, [100, 300], [work(500), work(50)])).toBe(350);
    expect(slotWaitMs(2, [100, 300], [work(500), work(50), work(10)])).toBe(360);
    // A free slot goes to the head at once (to 500); the second takes the slot free at 100 (to 150).
    expect(slotWaitMs(3, [100, 300], [work(500), work(50)])).toBe(150);
    expect(slotWaitMs(0, [], [])).toBe(Infinity);
  });

  it("counts a waiting request's prompt against every slot: the worker runs it between decode steps", () => {
    // The head takes the slot free at 100 and runs a 40 ms prompt: the other slot frees at 340, not 300.
    expect(slotWaitMs(2, [100, 300], [work(500, 40)])).toBe(340);
  });
});
