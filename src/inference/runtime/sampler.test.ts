import { describe, expect, it } from 'vitest';
import { adjustLogits, argmax, mulberry32, sample } from './sampler.js';

describe('sampler', () => {
  const logits = Float32Array.from([1, 3, 2, 0.5]);

  it('top_k 1 and min_p 1 always draw the most likely token', () => {
    const rand = mulberry32(1);
    for (let i = 0; i < 50; i++) {
      expect(sample(logits, 0, 4, 2, 1, rand, { topK: 1, minP: 0 })).toBe(1);
      expect(sample(logits, 0, 4, 2, 1, rand, { topK: 0, minP: 1 })).toBe(1);
    }
  });

  it('top_k 2 draws only the two most likely tokens, both of them', () => {
    const rand = mulberry32(2);
    const seen = new Set<number>();
    for (let i = 0; i < 200; i++) seen.add(sample(logits, 0, 4, 2, 1, rand, { topK: 2, minP: 0 }));
    expect([...seen].sort()).toEqual([1, 2]);
  });

  it('applies logit_bias and presence / frequency penalties over the counts', () => {
    const out = new Float32Array(4);
    adjustLogits(logits, 0, 4, { bias: [[3, 100]], presence: 0, frequency: 0 }, new Map(), out);
    expect(argmax(out, 0, 4)).toBe(3);
    adjustLogits(logits, 0, 4, { bias: [], presence: 0.5, frequency: 1 }, new Map([[1, 2]]), out);
    expect(out[1]).toBeCloseTo(3 - 2 * 1 - 0.5);
    expect(out[2]).toBe(2);
    expect(argmax(out, 0, 4)).toBe(2);
  });
});
