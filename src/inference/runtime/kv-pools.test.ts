import { describe, expect, it } from 'vitest';
import ort from 'onnxruntime-node';
import { generateCheckpoint } from '../convert/generate.js';
import { buildLlamaOnnx } from '../convert/onnx-writer.js';
import { headSize } from '../convert/llama2c.js';
import { slotStepDone, slotStepFeeds } from './kv-slots.js';
import { KvPools, RUN_FIXED_COST_WEIGHT_BYTES } from './kv-pools.js';
import { referenceSteps } from '../../../test/reference-steps.js';

// The slot-cache graph stepped the way the worker steps it (plan, then a run per cache), checked
// against run.c's forward pass one sequence at a time while a long sequence moves apart and back.

const TOL = 1e-4;

// The graph here is tiny (a few kB of weights): the tests give a run no fixed cost unless they say so,
// so that a few hundred positions of its small cache are worth a second run.
async function setup(split: boolean, weightBytes = 1000, runFixedWeightBytes = 0) {
  const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 8, nKvHeads: 4, vocabSize: 64, seqLen: 160, seed: 7, std: 0.3 });
  const sess = await ort.InferenceSession.create(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model, { intraOpNumThreads: 1 });
  const pools = new KvPools({ layers: 2, kvHeads: 4, headDim: headSize(ck.config), positionsMax: 160, emptyCacheFeeds: true }, weightBytes, split, runFixedWeightBytes);
  const ref = referenceSteps(ck);
  /** One step as worker.ts slotStep runs it; answers how many runs it took. */
  const step = async (rows: Array<{ seq: number; tokens: number[] }>) => {
    const runs = pools.plan(rows);
    for (const run of runs) {
      const part = run.rows.map((i) => rows[i]!);
      const st = slotStepFeeds(run.pool, part);
      ref.check(part, slotStepDone(run.pool, st, await sess.run(st.feeds)), (seq) => pools.len(seq));
    }
    return runs.length;
  };
  return { pools, step, tok: ref.tok, maxErr: ref.maxErr };
}

describe('KvPools', () => {
  it('runs a sequence far longer than the others apart, and puts it back once they have grown close, matching the reference throughout', async () => {
    const { pools, step, tok, maxErr } = await setup(true);
    const shorts = [1, 2, 3];
    expect(await step(shorts.map((seq) => ({ seq, tokens: tok(5, seq) })))).toBe(1);
    // A long prompt arrives: it starts in a cache of its own, so the short rows keep reading 64 positions.
    expect(await step([{ seq: 9, tokens: tok(100, 9) }])).toBe(1);
    expect(pools.caches[1]!.has(9)).toBe(true);
    expect(pools.near.cap).toBe(64);
    for (let i = 0; i < 3; i++) expect(await step([...shorts, 9].map((seq) => ({ seq, tokens: tok(1, seq + i) })))).toBe(2);
    expect(pools.near.cap).toBe(64);
    expect(pools.caches[1]!.cap).toBeGreaterThanOrEqual(104);
    // The short ones grow up to the long one's capacity (it waits): one cache again, its keys and values copied back.
    let runs = 2;
    for (let i = 0; pools.caches[1]!.live && i < 120; i++) runs = await step(shorts.map((seq) => ({ seq, tokens: tok(1, seq * 3 + i) })));
    expect(pools.caches[1]!.live).toBe(0);
    expect(pools.caches[1]!.bytes).toBe(0);
    expect(runs).toBe(1);
    expect(await step([...shorts, 9].map((seq) => ({ seq, tokens: tok(1, seq) })))).toBe(1);
    expect(maxErr()).toBeLessThan(TOL);
  });

  it('moves a sequence from the near cache when it outgrows the others; its cache keeps its buffer for the next until released', async () => {
    const { pools, step, tok, maxErr } = await setup(true);
    await step([1, 2, 3].map((seq) => ({ seq, tokens: tok(4, seq) })));
    // Sequence 1 takes a long second turn: 90 more positions in one step, which would grow every row's capacity.
    expect(await step([{ seq: 1, tokens: tok(90, 1) }])).toBe(1);
    expect(pools.caches[1]!.has(1)).toBe(true);
    expect(pools.near.cap).toBe(64);
    expect(await step([1, 2, 3].map((seq) => ({ seq, tokens: tok(1, seq + 5) })))).toBe(2);
    const farBytes = pools.caches[1]!.bytes;
    expect(farBytes).toBe(2 * 2 * 1 * pools.caches[1]!.cap * 4 * 4 * 4); // one slot: K and V, 2 layers, 4 kv heads, head size 4
    expect(pools.delete(1)).toBe(true);
    expect(pools.caches[1]!.bytes).toBe(farBytes);
    expect(await step([2, 3].map((seq) => ({ seq, tokens: tok(1, seq) })))).toBe(1);
    pools.delete(2);
    pools.delete(3);
    expect(pools.release()).toBe(true);
    expect(pools.bytes).toBe(0);
    expect(maxErr()).toBeLessThan(TOL);
  });

  it('keeps sequences of three lengths in three caches, each row reading about its own length', async () => {
    const { pools, step, tok, maxErr } = await setup(true, 200);
    await step([1, 2, 3, 4].map((seq) => ({ seq, tokens: tok(5, seq) })));
    await step([5, 6, 7].map((seq) => ({ seq, tokens: tok(90, seq) })));
    await step([{ seq: 8, tokens: tok(150, 8) }]);
    expect(await step([1, 2, 3, 4, 5, 6, 7, 8].map((seq) => ({ seq, tokens: tok(1, seq + 1) })))).toBe(3);
    expect(pools.caches.map((c) => c.live)).toEqual([4, 3, 1, 0]);
    expect(pools.caches[0]!.cap).toBe(64);
    expect(pools.caches[1]!.cap).toBeLessThan(pools.caches[2]!.cap);
    expect(maxErr()).toBeLessThan(TOL);
  });

  it('matches the reference through random joins, prompts, decode steps and leaves, moving sequences both ways', async () => {
    const { pools, step, tok, maxErr } = await setup(true);
    let seed = 11;
    const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
    const live = new Map<number, number>(); // sequence -> positions
    let next = 1;
    let split = 0;
    for (let i = 0; i < 80; i++) {
      const r = rand(10);
      if ((r < 2 && live.size < 6) || live.size === 0) {
        // A new sequence: a short prompt, or now and then a long one.
        const n = rand(4) === 0 ? 40 + rand(60) : 1 + rand(8);
        live.set(next, n);
        await step([{ seq: next, tokens: tok(n, next++) }]);
      } else if (r === 2 && live.size > 1) {
        const gone = [...live.keys()][rand(live.size)]!;
        expect(pools.delete(gone)).toBe(true);
        live.delete(gone);
      } else {
        // Decode the live sequences that have room, some of them or all.
        const rows = [...live].filter(([, len]) => len < 150 && rand(5) > 0).map(([seq]) => seq);
        if (!rows.length) continue;
        if ((await step(rows.map((seq) => ({ seq, tokens: tok(1, seq + i) })))) === 2) split++;
        for (const seq of rows) live.set(seq, live.get(seq)! + 1);
      }
      for (const [seq, len] of live) expect(pools.len(seq)).toBe(len);
    }
    expect(split).toBeGreaterThan(0);
    expect(maxErr()).toBeLessThan(TOL);
  });

  it('keeps every sequence together when a second run would cost more than it saves, its fixed cost included, or when told to', async () => {
    for (const [split, weightBytes, fixed] of [
      [true, 10_000_000, 0],
      // A tiny graph's run still costs its operators' dispatch (RUN_FIXED_COST_WEIGHT_BYTES): the
      // ~26 kB of cache the split below saves a step (first test) are not worth it.
      [true, 1000, RUN_FIXED_COST_WEIGHT_BYTES],
      [false, 1000, 0],
    ] as const) {
      const { pools, step, tok, maxErr } = await setup(split, weightBytes, fixed);
      await step([1, 2, 3].map((seq) => ({ seq, tokens: tok(5, seq) })));
      expect(await step([{ seq: 9, tokens: tok(100, 9) }])).toBe(1);
      expect(await step([1, 2, 3, 9].map((seq) => ({ seq, tokens: tok(1, seq) })))).toBe(1);
      expect(pools.near.live).toBe(pools.live);
      expect(pools.near.cap).toBeGreaterThanOrEqual(106);
      expect(maxErr()).toBeLessThan(TOL);
    }
  });
});
