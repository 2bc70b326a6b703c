import { describe, expect, it } from 'vitest';
import { commonOpening, KEPT_PROMPT_REUSE_TOKENS_MIN, KeptPrompts } from './kept-prompts.js';

const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

function kept(bytesMax = 1_000, bytesPerPosition = 1) {
  const freed: number[] = [];
  return { kp: new KeptPrompts(bytesMax, bytesPerPosition, (seqs) => freed.push(...seqs)), freed };
}

describe('kept prompts', () => {
  it('finds the longest common opening of the same scope, short of the prompt’s last token', () => {
    const { kp } = kept();
    kp.add(1, 'u', range(0, 40));
    kp.add(2, 'u', [...range(0, 20), ...range(500, 30)]);
    kp.add(3, 'v', range(0, 60));
    expect(kp.best('u', [...range(0, 30), 999])).toMatchObject({ kept: { seq: 1 }, at: 30 });
    expect(kp.best('u', [...range(0, 20), ...range(500, 10), 7])).toMatchObject({ kept: { seq: 2 }, at: 30 });
    // The prompt's last token always runs: a prompt equal to a kept opening starts one before its end.
    expect(kp.best('u', range(0, 40))).toMatchObject({ kept: { seq: 1 }, at: 39 });
    // Another scope's are never found, however long they match.
    expect(kp.best('w', range(0, 60))).toBeUndefined();
    expect(kp.best('v', range(0, 61))).toMatchObject({ kept: { seq: 3 }, at: 60 });
  });

  it('takes no opening shorter than its minimum, nor one short against the rest of the prompt', () => {
    const { kp } = kept();
    kp.add(1, 'u', range(0, 100));
    expect(kp.best('u', [...range(0, KEPT_PROMPT_REUSE_TOKENS_MIN - 1), 999, 998])).toBeUndefined();
    expect(kp.best('u', [...range(0, KEPT_PROMPT_REUSE_TOKENS_MIN), 999, 998])).toMatchObject({ at: KEPT_PROMPT_REUSE_TOKENS_MIN });
    // 16 kept tokens before 300 new ones: running all of them fresh is cheaper.
    expect(kp.best('u', [...range(0, 16), ...range(1000, 300)])).toBeUndefined();
    expect(kp.best('u', [...range(0, 100), ...range(1000, 150)])).toMatchObject({ at: 100 });
  });

  it('keeps within its bytes, counted in whole blocks, the least recently used out first, and none past it', () => {
    const { kp, freed } = kept(160, 2);
    expect(kp.add(1, 'u', range(0, 20))).toBe(true); // 2 blocks of 16 positions: 64 bytes
    expect(kp.add(2, 'u', range(100, 20))).toBe(true); // 128
    kp.use(kp.best('u', [...range(0, 20), 5])!.kept); // 1 is the most recent now
    kp.forked(kp.best('u', [...range(0, 20), 5])!.kept);
    expect(kp.add(3, 'v', range(200, 9))).toBe(true); // 1 block: 160 fits
    expect(kp.add(4, 'v', range(300, 9))).toBe(true); // 192 > 160: 2 goes
    expect(freed).toEqual([2]);
    expect(kp.bytes).toBe(128);
    expect(kp.add(5, 'u', range(400, 81))).toBe(false); // 6 blocks, 192 bytes alone: never kept
    expect(kp.fits(80)).toBe(true);
    expect(kp.fits(81)).toBe(false);
    expect(kept(0).kp.fits(1)).toBe(false);
  });

  it('never frees one that a prompt is starting from, until that start is answered', () => {
    const { kp, freed } = kept(100, 1);
    kp.add(1, 'u', range(0, 48)); // 3 blocks of 16 positions: 48 bytes
    const found = kp.best('u', [...range(0, 48), 7])!;
    kp.use(found.kept);
    kp.add(2, 'u', range(100, 48));
    kp.add(3, 'u', range(200, 48)); // 144 > 100: 1 is the least recent, but held; 2 goes
    expect(freed).toEqual([2]);
    kp.forked(found.kept);
    expect(freed).toEqual([2]); // 96 fit
    kp.add(4, 'u', range(300, 48)); // 144 again: 1 may go now
    expect(freed).toEqual([2, 1]);
    expect(kp.bytes).toBe(96);
  });

  it('frees the kept ones of the scope whose tokens open a newly kept one (a conversation’s earlier turns)', () => {
    const { kp, freed } = kept();
    kp.add(1, 'u', range(0, 30));
    kp.add(2, 'v', range(0, 30));
    kp.add(3, 'u', range(0, 50));
    expect(freed).toEqual([1]);
    expect(kp.size).toBe(2);
    expect(kp.best('u', [...range(0, 45), 9])).toMatchObject({ kept: { seq: 3 }, at: 45 });
    kp.clear();
    expect([kp.size, kp.bytes, kp.best('u', range(0, 50))]).toEqual([0, 0, undefined]);
    expect(freed).toEqual([1]); // clear() is for a dead worker: nothing to free there
  });

  it('measures common openings', () => {
    expect(commonOpening([1, 2, 3], [1, 2, 4], 10)).toBe(2);
    expect(commonOpening([1, 2, 3], [1, 2, 3, 4], 10)).toBe(3);
    expect(commonOpening([1, 2, 3], [1, 2, 3], 2)).toBe(2);
    expect(commonOpening([], [1], 5)).toBe(0);
  });
});
