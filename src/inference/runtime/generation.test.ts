import { describe, expect, it } from 'vitest';
import { schemaGrammar } from '../grammar/json-schema.js';
import { draw, Maskers, MASKERS_MAX, startSampling } from './generation.js';
import type { SamplerSpec } from './protocol.js';

// A generation's state from one step to the next: its budget and end of text, its penalties'
// counts, its logprobs and its grammar, drawn from rows of logits as a decode run hands them over.

// Token 0 ends text; the others are JSON pieces a schema's document is made of.
const TEXTS = [null, '{', '}', '"a"', ':', 'true', 'false', 'x'];
const V = TEXTS.length;
const greedy = (over: Partial<SamplerSpec> = {}): SamplerSpec => ({ temperature: 0, topP: 1, seed: 1, budget: 8, eos: [0], ...over });
/** One row of logits that ranks `order` first to last (the rest below them all). */
function ranked(order: number[]): Float32Array {
  const l = new Float32Array(V).fill(-10);
  order.forEach((t, i) => (l[t] = 10 - i));
  return l;
}

describe('generation', () => {
  it('draws greedily from its row of a batch, feeds the token back and ends at its budget', () => {
    const sm = startSampling(greedy({ budget: 2 }), new Maskers(TEXTS));
    const batch = new Float32Array(2 * V);
    batch.set(ranked([7]), 0);
    batch.set(ranked([5]), V);
    expect(draw(sm, batch, 1, V)).toBe(5);
    expect([sm.next, sm.made, sm.ended]).toEqual([5, 1, false]);
    expect(draw(sm, batch, 0, V)).toBe(7);
    expect([sm.next, sm.made, sm.ended]).toEqual([7, 2, true]);
  });

  it('ends at end of text before its budget', () => {
    const sm = startSampling(greedy(), new Maskers(TEXTS));
    expect(draw(sm, ranked([0]), 0, V)).toBe(0);
    expect(sm.ended).toBe(true);
  });

  it('counts what it made for its penalties, so a repeated token loses to the next', () => {
    const sm = startSampling(greedy({ adjust: { bias: [], presence: 0, frequency: 5 } }), new Maskers(TEXTS));
    const l = ranked([7, 5]);
    expect(draw(sm, l, 0, V)).toBe(7);
    expect(draw(sm, l, 0, V)).toBe(5);
    expect(sm.counts).toEqual(new Map([[7, 1], [5, 1]]));
    expect(l[7]).toBe(10); // the batch's logits are left as they came
  });

  it('reports a logprob and its alternatives only when asked for', () => {
    const plain = startSampling(greedy(), new Maskers(TEXTS));
    draw(plain, ranked([7]), 0, V);
    expect(plain.lastLogprob).toBeNull();
    const asked = startSampling(greedy({ topLogprobs: 2 }), new Maskers(TEXTS));
    draw(asked, ranked([7, 5]), 0, V);
    expect(asked.lastLogprob!.top.map(([t]) => t)).toEqual([7, 5]);
    expect(asked.lastLogprob!.logprob).toBeCloseTo(asked.lastLogprob!.top[0]![1]);
  });

  it("holds a generation to its grammar: only tokens that continue the document, end of text once it is whole", () => {
    const grammar = schemaGrammar({ type: 'object', properties: { a: { type: 'boolean' } }, required: ['a'], additionalProperties: false });
    const sm = startSampling(greedy({ grammar: { key: 'k', grammar } }), new Maskers(TEXTS));
    // The model prefers 'x' and end of text throughout; the grammar lets neither through until the document is whole.
    const out: number[] = [];
    for (const second of [1, 3, 4, 5, 2]) {
      out.push(draw(sm, ranked([7, 0, second]), 0, V));
      expect(sm.ended).toBe(false);
    }
    expect(out.map((t) => TEXTS[t]).join('')).toBe('{"a":true}');
    expect(draw(sm, ranked([7, 0]), 0, V)).toBe(0);
    expect(sm.ended).toBe(true);
  });

  it('keeps the masks of the most recently used grammars only', () => {
    const maskers = new Maskers(TEXTS);
    const g = schemaGrammar({ type: 'boolean' });
    const first = maskers.get('g0', g);
    const kept = maskers.get('g1', g);
    for (let i = 2; i < MASKERS_MAX; i++) maskers.get(`g${i}`, g);
    expect(maskers.get('g0', g)).toBe(first); // MASKERS_MAX of them: all still built
    maskers.get(`g${MASKERS_MAX}`, g); // one more: the least recently used (g1) goes
    expect(maskers.get('g0', g)).toBe(first);
    expect(maskers.get('g1', g)).not.toBe(kept);
  });
});
