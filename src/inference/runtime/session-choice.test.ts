import { describe, expect, it } from 'vitest';
import { LONG_SESSION_STEP_TOKENS_MIN, NARROW_STEP_TOKENS_MAX, PREFILL_SPINNING_STEP_TOKENS_MAX, PREFILL_STEP_TOKENS_MIN, SessionChoice, SPINNING_SEQUENCES_MAX, sessionsFor, type SessionKind } from './session-choice.js';

const PAIR: SessionKind[] = ['wide', 'narrow'];
const ALL: SessionKind[] = ['wide', 'narrow', 'spinning'];

/** Runs `steps` steps of `tokens` tokens on the allowed `kinds`, each taking what `cost` says for its session; counts where they ran. */
function drive(c: SessionChoice, tokens: number, steps: number, cost: (k: SessionKind) => number, kinds: SessionKind[] = PAIR): Record<SessionKind, number> {
  const ran = { narrow: 0, wide: 0, spinning: 0, prefill: 0, prefillSpinning: 0 };
  for (let i = 0; i < steps; i++) {
    const k = c.pick(tokens, kinds);
    expect(kinds).toContain(k);
    ran[k]++;
    c.record(tokens, kinds, k, cost(k));
  }
  return ran;
}

describe('sessionsFor', () => {
  const loaded = { narrow: true, spinning: true, prefill: false, prefillSpinning: false };
  it('offers one thread only to steps of at most NARROW_STEP_TOKENS_MAX tokens', () => {
    expect(sessionsFor(NARROW_STEP_TOKENS_MAX, 1, loaded)).toEqual(ALL);
    expect(sessionsFor(NARROW_STEP_TOKENS_MAX + 1, 1, loaded)).toEqual(['wide', 'spinning']);
  });
  it('offers spinning threads only while the model holds at most SPINNING_SEQUENCES_MAX sequences', () => {
    expect(sessionsFor(4, SPINNING_SEQUENCES_MAX, loaded)).toEqual(ALL);
    expect(sessionsFor(16, 16, loaded)).toEqual(PAIR);
    expect(sessionsFor(512, 16, loaded)).toEqual(['wide']);
  });
  it('offers only the sessions the model loaded', () => {
    expect(sessionsFor(1, 1, { narrow: false, spinning: false, prefill: false, prefillSpinning: false })).toEqual(['wide']);
    expect(sessionsFor(1, 1, { narrow: false, spinning: true, prefill: false, prefillSpinning: false })).toEqual(['wide', 'spinning']);
    expect(sessionsFor(512, 1, { narrow: false, spinning: false, prefill: true, prefillSpinning: false })).toEqual(['wide', 'prefill']);
  });
  it('offers the prefill session only to steps of at least PREFILL_STEP_TOKENS_MIN tokens: several rows, never a decode step of one', () => {
    const all = { narrow: true, spinning: true, prefill: true, prefillSpinning: false };
    expect(PREFILL_STEP_TOKENS_MIN).toBeGreaterThan(1);
    expect(sessionsFor(PREFILL_STEP_TOKENS_MIN - 1, 1, all)).not.toContain('prefill');
    expect(sessionsFor(PREFILL_STEP_TOKENS_MIN, 1, all)).toEqual([...ALL, 'prefill']);
    expect(sessionsFor(NARROW_STEP_TOKENS_MAX + 1, 1, all)).toEqual(['wide', 'spinning', 'prefill']);
    expect(sessionsFor(16, 16, all)).toEqual(['wide', 'narrow', 'prefill']); // a decode step of 16 rows
  });
  it('offers the prefill graph on spinning threads only to short steps of several rows while few sequences run', () => {
    const all = { narrow: true, spinning: true, prefill: true, prefillSpinning: true };
    expect(sessionsFor(20, 1, all)).toEqual(['wide', 'narrow', 'spinning', 'prefill', 'prefillSpinning']); // a chat prompt
    expect(sessionsFor(PREFILL_STEP_TOKENS_MIN - 1, 1, all)).not.toContain('prefillSpinning');
    expect(sessionsFor(PREFILL_SPINNING_STEP_TOKENS_MAX, SPINNING_SEQUENCES_MAX, all)).toContain('prefillSpinning');
    expect(sessionsFor(PREFILL_SPINNING_STEP_TOKENS_MAX + 1, 1, all)).toEqual(['wide', 'spinning', 'prefill']); // long: sleeping threads
    expect(sessionsFor(16, SPINNING_SEQUENCES_MAX + 1, all)).toEqual(['wide', 'narrow', 'prefill']); // many streams never spin
    expect(sessionsFor(16 * 20, 16, all)).toEqual(['wide', 'prefill']); // 16 prompts of 20 tokens in one step
    expect(sessionsFor(1, 1, all)).toEqual(ALL);
  });
  it('offers a spinning session on the one-token graph only to steps of one token a row', () => {
    const oneToken = { narrow: true, spinning: true, spinningOneToken: true, prefill: true, prefillSpinning: true };
    expect(sessionsFor(1, 1, oneToken)).toEqual(ALL); // one stream's decode step
    expect(sessionsFor(4, 4, oneToken, false, 1)).toEqual(ALL); // four rows of one token
    expect(sessionsFor(20, 1, oneToken)).toEqual(['wide', 'narrow', 'prefill', 'prefillSpinning']); // a chat prompt
    expect(sessionsFor(2, 1, oneToken)).toEqual(PAIR); // a prompt's last two tokens
    expect(sessionsFor(4, 2, oneToken, false, 2)).toEqual(PAIR); // two rows of two
  });
  it('runs steps whose longest row adds at least LONG_SESSION_STEP_TOKENS_MIN tokens on the long-step session alone, never while crowded', () => {
    const all = { narrow: true, spinning: true, prefill: true, prefillSpinning: true, long: true };
    expect(sessionsFor(LONG_SESSION_STEP_TOKENS_MIN, 1, all)).toEqual(['long']); // one long prompt chunk
    expect(sessionsFor(LONG_SESSION_STEP_TOKENS_MIN - 1, 1, all)).toEqual(['wide', 'spinning', 'prefill']);
    expect(sessionsFor(1000, 16, all)).toEqual(['long']);
    // many short rows are many short pieces: 64 prompts of 20 tokens joining at once
    expect(sessionsFor(64 * 20, 64, all, false, 20)).toEqual(['wide', 'prefill']);
    expect(sessionsFor(2 * 700, 2, all, false, 700)).toEqual(['long']);
    expect(sessionsFor(1000, 1, { ...all, long: false })).toEqual(['wide', 'spinning', 'prefill']);
    expect(sessionsFor(1000, 1, { ...all, prefillNarrow: true }, true)).toEqual(['prefillNarrow']);
  });

  it('gives a step while other workers fill the cores (peers.ts) one-thread sessions only, and others the usual choice', () => {
    const all = { narrow: true, spinning: true, prefill: true, prefillSpinning: true, prefillNarrow: true };
    expect(sessionsFor(1, 1, all, true)).toEqual(['narrow']);
    expect(sessionsFor(16, 16, all, true)).toEqual(['narrow', 'prefillNarrow']);
    expect(sessionsFor(200, 8, all, true)).toEqual(['prefillNarrow']);
    // Without a one-thread session for its size, a crowded step sleeps between operators: never spins.
    expect(sessionsFor(200, 1, { ...all, prefillNarrow: false }, true)).toEqual(['wide', 'prefill']);
    expect(sessionsFor(1, 1, all, false)).toEqual(['wide', 'narrow', 'spinning']);
    expect(sessionsFor(16, 16, all, false)).not.toContain('prefillNarrow'); // alone, the cores are its own
  });
});

describe('SessionChoice', () => {
  it('measures both sessions, then runs each step size on the faster and retries the other now and then', () => {
    const c = new SessionChoice();
    expect(c.chosen(1, PAIR)).toBeUndefined();
    const ran = drive(c, 1, 650, (k) => (k === 'narrow' ? 1.3 : 2.0));
    expect(c.chosen(1, PAIR)).toBe('narrow');
    // two bursts of 3 each to measure (each burst's first run not counted), then a burst of the slower every 256 steps
    expect(ran.wide).toBeGreaterThanOrEqual(6 + 3 * 2);
    expect(ran.wide).toBeLessThanOrEqual(6 + 3 * 3);
    // another size is measured on its own: at 8 rows the wide session is the faster here
    drive(c, 8, 40, (k) => (k === 'narrow' ? 5.5 : 4.7));
    expect(c.chosen(8, PAIR)).toBe('wide');
    expect(c.chosen(1, PAIR)).toBe('narrow');
  });

  it('with one session allowed runs every step there and measures nothing', () => {
    const c = new SessionChoice();
    const ran = drive(c, NARROW_STEP_TOKENS_MAX + 1, 100, () => 9, ['wide']);
    expect(ran).toEqual({ narrow: 0, wide: 100, spinning: 0, prefill: 0, prefillSpinning: 0 });
    expect(c.chosen(512, ['wide'])).toBe('wide');
  });

  it('picks the fastest of three, tries each other one in turn, and keeps to the allowed ones', () => {
    const c = new SessionChoice();
    const cost = (k: SessionKind) => ({ narrow: 1.4, wide: 1.5, spinning: 1.06 })[k];
    const ran = drive(c, 1, 1300, cost, ALL);
    expect(c.chosen(1, ALL)).toBe('spinning');
    expect(ran.spinning).toBeGreaterThan(1270);
    // both others are retried: 6 runs to measure, then a burst of 3 in every 512 steps each
    for (const k of ['narrow', 'wide'] as const) {
      expect(ran[k]).toBeGreaterThanOrEqual(6 + 3 * 2);
      expect(ran[k]).toBeLessThanOrEqual(6 + 3 * 3);
    }
    // the same size with spinning not allowed (many sequences): the faster of the other two, from the same estimates
    expect(c.chosen(1, PAIR)).toBe('narrow');
    const pair = drive(c, 1, 100, cost, PAIR);
    expect(pair.spinning).toBe(0);
    expect(pair.narrow).toBeGreaterThan(95);
  });

  it('after the warm-up measured a long size until it chose, runs its first live steps on the fastest', async () => {
    const LONG: SessionKind[] = ['wide', 'spinning', 'prefill'];
    // far apart, so that a timer late by tens of milliseconds on a busy machine changes no order
    const costMs: Record<SessionKind, number> = { narrow: 0, wide: 150, spinning: 145, prefill: 25, prefillSpinning: 0 };
    const warmed = new SessionChoice();
    const warmRuns = { narrow: 0, wide: 0, spinning: 0, prefill: 0, prefillSpinning: 0 };
    await warmed.measure(512, LONG, 12, (k) => new Promise((r) => setTimeout(r, (warmRuns[k]++, costMs[k]))));
    // each session's first run allocates (not counted), one counted run drops the slower two, two more decide
    expect(warmRuns).toEqual({ narrow: 0, wide: 2, spinning: 2, prefill: 4, prefillSpinning: 0 });
    expect(warmed.chosen(512, LONG)).toBe('prefill');
    const first = Array.from({ length: 3 }, () => {
      const k = warmed.pick(512, LONG);
      warmed.record(512, LONG, k, costMs[k]);
      return k;
    });
    expect(first).toEqual(['prefill', 'prefill', 'prefill']);
    // three runs only allocate: the slower sessions are still measured on live steps
    const once = new SessionChoice();
    await once.measure(512, LONG, 3, (k) => new Promise((r) => setTimeout(r, costMs[k])));
    expect(once.chosen(512, LONG)).toBeUndefined();
    expect(once.pick(512, LONG)).toBe('wide');
    // ... and so does a warm-up out of time: wide's first run (150 ms), spinning's where the
    // timer was not late by 100 ms, and then 250 ms had passed
    const late = new SessionChoice();
    const lateRuns = { narrow: 0, wide: 0, spinning: 0, prefill: 0, prefillSpinning: 0 };
    await late.measure(512, LONG, 12, (k) => new Promise((r) => setTimeout(r, (lateRuns[k]++, costMs[k]))), 250);
    expect(lateRuns.wide).toBe(1);
    expect(lateRuns.spinning).toBeLessThanOrEqual(1);
    expect(lateRuns.prefill).toBe(0);
    expect(late.chosen(512, LONG)).toBeUndefined();
  });

  it('runs long steps on the prefill session where it is faster, and not where it is slower', () => {
    // m25 int4, a 512-token prompt, as measured when the prefill session multiplied in float32: faster on an Intel machine, twice as slow on an AMD one.
    const LONG: SessionKind[] = ['wide', 'spinning', 'prefill'];
    const intel = new SessionChoice();
    const ran = drive(intel, 512, 300, (k) => ({ narrow: 0, wide: 267, spinning: 262, prefill: 212 })[k], LONG);
    expect(intel.chosen(512, LONG)).toBe('prefill');
    // long runs are measured with 4 runs a session (the first not counted), in turns, and another retried once every 16
    expect(ran.wide + ran.spinning).toBeLessThanOrEqual(8 + Math.ceil(300 / 16));
    expect(ran.prefill).toBeGreaterThanOrEqual(300 - 8 - Math.ceil(300 / 16));
    const zen = new SessionChoice();
    drive(zen, 512, 300, (k) => ({ narrow: 0, wide: 176, spinning: 172, prefill: 330 })[k], LONG);
    expect(zen.chosen(512, LONG)).toBe('spinning');
    // decode steps of the same model never measure it
    expect(drive(zen, 1, 50, () => 1, ['wide']).prefill).toBe(0);
  });

  it('measures no further at a long size a session whose counted run took 1.25 times another\'s, and still moves there if its retries are faster', () => {
    const LONG: SessionKind[] = ['wide', 'spinning', 'prefill'];
    // Zen 4: the prefill session ~1.9x slower at 512 tokens; 12 steps: 4 runs each of wide and spinning (the first not counted), 2 of prefill
    const zen = new SessionChoice();
    const first = drive(zen, 512, 12, (k) => ({ narrow: 0, wide: 176, spinning: 172, prefill: 330 })[k], LONG);
    expect(first.prefill).toBe(2); // before: 4, as many as the others
    expect(zen.chosen(512, LONG)).toBe('spinning');
    // A first counted run that misled (a pre-empted run): the retries, one every 16 long steps, move the size there.
    const misled = new SessionChoice();
    let prefillRuns = 0;
    drive(misled, 512, 200, (k) => (k === 'prefill' ? (++prefillRuns <= 2 ? 400 : 150) : { narrow: 0, wide: 176, spinning: 172, prefill: 0 }[k]), LONG);
    expect(misled.chosen(512, LONG)).toBe('prefill');
  });

  it('measures steps that read no cache (a first chunk) apart from steps of as many tokens that read one', () => {
    const LONG: SessionKind[] = ['wide', 'spinning', 'prefill'];
    // A 2,000-token prompt: 1,024 tokens on an empty cache, then 976 over 2,048 positions, in turns.
    const msOf = { fresh: { wide: 420, spinning: 300, prefill: 250 }, cached: { wide: 900, spinning: 510, prefill: 400 } } as Record<string, Partial<Record<SessionKind, number>>>;
    const cost = (k: SessionKind, fresh: boolean) => msOf[fresh ? 'fresh' : 'cached']![k]!;
    const c = new SessionChoice();
    // each shape's first run on a session allocates: far slower, and at the other shape's turn
    const seen = new Set<string>();
    for (let i = 0; i < 40; i++) {
      const [tokens, fresh] = i % 2 ? [976, false] : [1024, true];
      const k = c.pick(tokens, LONG, fresh);
      const first = !seen.has(`${k}${fresh}`);
      seen.add(`${k}${fresh}`);
      c.record(tokens, LONG, k, cost(k, fresh) * (first ? 3 : 1), fresh);
    }
    expect(c.chosen(1024, LONG, true)).toBe('prefill');
    expect(c.chosen(976, LONG, false)).toBe('prefill');
    // a size's two shapes are two estimates: one chosen leaves the other unmeasured
    const d = new SessionChoice();
    drive(d, 512, 12, (k) => ({ narrow: 0, wide: 176, spinning: 172, prefill: 330 })[k], LONG);
    expect(d.chosen(512, LONG)).toBe('spinning');
    expect(d.chosen(512, LONG, true)).toBeUndefined();
  });

  it('keeps decode steps of many rows to the short rule however long they take: retries in bursts every 256 steps', () => {
    // 16 rows of m110 int4: ~21 ms on two threads, ~30 on one; a retry every 16 steps would run 1 in 16 on the slower one.
    const c = new SessionChoice();
    const ran = drive(c, 16, 2000, (k) => (k === 'wide' ? 21 : 30));
    expect(c.chosen(16, PAIR)).toBe('wide');
    // measuring (2 bursts of 3 each) and a burst of 3 every 256 steps
    expect(ran.narrow).toBeLessThanOrEqual(6 + 3 * Math.ceil(2000 / 256));
  });

  it('keeps to the faster session while the machine speeds up and slows down under both', () => {
    // The whole machine runs 1x to 2.5x slower in waves of 400 steps, both sessions alike. A retried
    // session's best run over a thousand steps must not be taken against the running one's last few.
    const c = new SessionChoice();
    let step = 0;
    const wave = () => 1 + 1.5 * (0.5 + 0.5 * Math.sin((2 * Math.PI * step) / 400));
    const ran = drive(c, 1, 4000, (k) => {
      step++;
      return (k === 'narrow' ? 1.42 : k === 'wide' ? 1.48 : 1.06) * wave();
    }, ALL);
    expect(c.chosen(1, ALL)).toBe('spinning');
    // every step but the measuring (12) and the retries (a burst of 3 every 256 steps)
    expect(ran.spinning).toBeGreaterThanOrEqual(4000 - 12 - 3 * Math.ceil(4000 / 256));
  });

  it('moves to a session whose warm runs are faster though its first run of each retry is slow', () => {
    // Each session's own weights: the first step on one after another ran is cold (3 ms here).
    const c = new SessionChoice();
    let last: SessionKind | undefined;
    let spinningMs = 1.7;
    const cost = (k: SessionKind) => {
      const cold = k !== last;
      last = k;
      if (cold) return 3;
      return k === 'narrow' ? 1.5 : k === 'wide' ? 1.6 : spinningMs;
    };
    const ran = drive(c, 1, 2000, cost, ALL);
    expect(c.chosen(1, ALL)).toBe('narrow');
    expect(ran.narrow).toBeGreaterThan(1800);
    // the load changes: spinning threads are now the fastest, and the retries' warm runs show it
    spinningMs = 1.1;
    drive(c, 1, 1600, cost, ALL);
    expect(c.chosen(1, ALL)).toBe('spinning');
  });

  it('follows a change of load, but not noise within the margin', () => {
    const c = new SessionChoice();
    let narrowMs = 1.3;
    drive(c, 1, 200, (k) => (k === 'narrow' ? narrowMs : 2.0));
    expect(c.chosen(1, PAIR)).toBe('narrow');
    // narrow slows to within 10 % of wide: it stays
    narrowMs = 1.9;
    drive(c, 1, 500, (k) => (k === 'narrow' ? narrowMs : 2.0));
    expect(c.chosen(1, PAIR)).toBe('narrow');
    // narrow is now clearly slower: the retries of wide see it, and the size moves over
    narrowMs = 3.0;
    drive(c, 1, 1200, (k) => (k === 'narrow' ? narrowMs : 2.0));
    expect(c.chosen(1, PAIR)).toBe('wide');
  });

  it('does not count the first run of a burst (it allocates, its weights are out of the caches)', () => {
    const c = new SessionChoice();
    let first = { narrow: true, wide: true, spinning: true };
    drive(c, 2, 12, (k) => {
      const ms = first[k] ? 100 : k === 'narrow' ? 1 : 2;
      first = { ...first, [k]: false };
      return ms;
    });
    expect(c.chosen(2, PAIR)).toBe('narrow');
  });

  it('is not held on the slower session by a few slow runs at the start (a new shape, a cold cache)', () => {
    const c = new SessionChoice();
    let narrowRuns = 0;
    const ran = drive(c, 1, 200, (k) => {
      if (k === 'wide') return 2.4;
      return ++narrowRuns <= 4 ? 12 : 1.6; // one thread's first runs are slow, then it is the faster
    });
    expect(c.chosen(1, PAIR)).toBe('narrow');
    expect(ran.narrow).toBeGreaterThan(150);
  });
});
