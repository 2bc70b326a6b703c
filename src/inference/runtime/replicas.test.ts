import { describe, expect, it } from 'vitest';
import { pickReplica } from './replicas.js';
import { sessionsFor } from './session-choice.js';

describe('replicas', () => {
  it('sends a request to the replica up with the fewest requests, the first on a tie', () => {
    const r = (load: number, alive = true) => ({ load: () => load, alive });
    const a = r(2), b = r(1), c = r(1);
    expect(pickReplica([a, b, c])).toBe(b);
    const d = r(0, false);
    expect(pickReplica([a, d])).toBe(a); // a dead replica takes nothing, however idle
    const e = r(0), f = r(0);
    expect(pickReplica([e, f])).toBe(e);
    const g = r(0, false), h = r(0, false);
    expect(pickReplica([g, h])).toBe(g); // all down: the first, whose refusal names the model down
  });

  it('gives a crowded step one-thread sessions only, and an uncrowded one the usual choice', () => {
    const all = { narrow: true, spinning: true, prefill: true, prefillSpinning: true, prefillNarrow: true };
    expect(sessionsFor(1, 1, all, true)).toEqual(['narrow']);
    expect(sessionsFor(16, 16, all, true)).toEqual(['narrow', 'prefillNarrow']);
    expect(sessionsFor(200, 8, all, true)).toEqual(['prefillNarrow']);
    // Without a one-thread session for its size, a crowded step sleeps between operators: never spins.
    expect(sessionsFor(200, 1, { ...all, prefillNarrow: false }, true)).toEqual(['wide', 'prefill']);
    expect(sessionsFor(1, 1, all, false)).toEqual(['wide', 'narrow', 'spinning']);
    expect(sessionsFor(1, 1, all, false)).not.toContain('prefillNarrow');
  });
});
