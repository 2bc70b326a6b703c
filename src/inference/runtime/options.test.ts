import { describe, expect, it } from 'vitest';
import { inStepBudget } from './options.js';

describe('inStepBudget', () => {
  // [rows, longest row] of each join
  const joins: Array<[number, number]> = [[1, 60], [1, 80], [2, 40], [1, 300], [1, 600], [3, 10]];
  const groups = (max: number) => inStepBudget(joins, (j) => j[0], (j) => j[1], max);

  it('fills a step while rows x the longest row fit the budget, in arrival order', () => {
    // 1x60, then 2x80 = 160, then 4x80 = 320 > 256: the third starts a step; 4x300 > 256 ...
    expect(groups(256)).toEqual([[[1, 60], [1, 80]], [[2, 40]], [[1, 300]], [[1, 600]], [[3, 10]]]);
    expect(groups(512)).toEqual([[[1, 60], [1, 80], [2, 40]], [[1, 300]], [[1, 600]], [[3, 10]]]);
  });

  it('gives an item over the budget a step of its own, and keeps every item once', () => {
    const g = groups(100);
    expect(g.flat()).toEqual(joins);
    expect(g.find((s) => s.some((j) => j[1] === 600))).toEqual([[1, 600]]);
    for (const s of g) if (s.length > 1) expect(s.reduce((n, j) => n + j[0], 0) * Math.max(...s.map((j) => j[1]))).toBeLessThanOrEqual(100);
    expect(inStepBudget([], () => 1, () => 1, 10)).toEqual([]);
  });
});
