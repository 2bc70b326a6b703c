import { describe, expect, it } from 'vitest';
import { pickReplica } from './replicas.js';

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
});
