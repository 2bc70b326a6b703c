import { describe, expect, it } from 'vitest';
import { NARROW_STEP_TOKENS_MAX, SessionChoice, type SessionKind } from './session-choice.js';

/** Runs `steps` steps of `tokens` tokens, each taking what `cost` says for its session; counts where they ran. */
function drive(c: SessionChoice, tokens: number, steps: number, cost: (k: SessionKind) => number): Record<SessionKind, number> {
  const ran = { narrow: 0, wide: 0 };
  for (let i = 0; i < steps; i++) {
    const k = c.pick(tokens);
    ran[k]++;
    c.record(tokens, k, cost(k));
  }
  return ran;
}

describe('SessionChoice', () => {
  it('measures both sessions, then runs each step size on the faster and retries the other now and then', () => {
    const c = new SessionChoice();
    expect(c.chosen(1)).toBeUndefined();
    const ran = drive(c, 1, 650, (k) => (k === 'narrow' ? 1.3 : 2.0));
    expect(c.chosen(1)).toBe('narrow');
    // 5 runs each to measure, then one retry of the slower every 64 steps
    expect(ran.wide).toBeGreaterThanOrEqual(5);
    expect(ran.wide).toBeLessThan(20);
    // another size is measured on its own: at 8 rows the wide session is the faster here
    drive(c, 8, 40, (k) => (k === 'narrow' ? 5.5 : 4.7));
    expect(c.chosen(8)).toBe('wide');
    expect(c.chosen(1)).toBe('narrow');
  });

  it('never runs a step of more than NARROW_STEP_TOKENS_MAX tokens on one thread', () => {
    const c = new SessionChoice();
    const ran = drive(c, NARROW_STEP_TOKENS_MAX + 1, 100, (k) => (k === 'narrow' ? 0.1 : 9));
    expect(ran).toEqual({ narrow: 0, wide: 100 });
    expect(c.chosen(512)).toBe('wide');
  });

  it('follows a change of load, but not noise within the margin', () => {
    const c = new SessionChoice();
    let narrowMs = 1.3;
    drive(c, 1, 200, (k) => (k === 'narrow' ? narrowMs : 2.0));
    expect(c.chosen(1)).toBe('narrow');
    // narrow slows to within 10 % of wide: it stays
    narrowMs = 1.9;
    drive(c, 1, 500, (k) => (k === 'narrow' ? narrowMs : 2.0));
    expect(c.chosen(1)).toBe('narrow');
    // narrow is now clearly slower: the retries of wide see it, and the size moves over
    narrowMs = 3.0;
    drive(c, 1, 800, (k) => (k === 'narrow' ? narrowMs : 2.0));
    expect(c.chosen(1)).toBe('wide');
  });

  it('does not count the first run of a session (it allocates)', () => {
    const c = new SessionChoice();
    let first = { narrow: true, wide: true };
    drive(c, 2, 12, (k) => {
      const ms = first[k] ? 100 : k === 'narrow' ? 1 : 2;
      first = { ...first, [k]: false };
      return ms;
    });
    expect(c.chosen(2)).toBe('narrow');
  });

  it('is not held on the slower session by a few slow runs at the start (a new shape, a cold cache)', () => {
    const c = new SessionChoice();
    let narrowRuns = 0;
    const ran = drive(c, 1, 200, (k) => {
      if (k === 'wide') return 2.4;
      return ++narrowRuns <= 4 ? 12 : 1.6; // one thread's first runs are slow, then it is the faster
    });
    expect(c.chosen(1)).toBe('narrow');
    expect(ran.narrow).toBeGreaterThan(150);
  });
});
