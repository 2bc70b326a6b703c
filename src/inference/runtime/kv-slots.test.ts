import { describe, expect, it } from 'vitest';
import ort from 'onnxruntime-node';
import { generateCheckpoint } from '../convert/generate.js';
import { buildLlamaOnnx, MASK_VALUE } from '../convert/onnx-writer.js';
import { checkedSlotSteps, promptsBesideDecoding, referenceSteps } from '../../../test/reference-steps.js';
import { headSize } from '../convert/llama2c.js';
import { HIDDEN_BIAS, KvSlots, slotStepDone, slotStepFeeds } from './kv-slots.js';
import { KeptArena } from './kept-arena.js';
import { KEPT_BLOCK_POSITIONS } from './kept-prompts.js';

// The slot-cache graph driven the way the worker drives it (the same two
// functions), checked against run.c's forward pass one sequence at a time:
// rows of different lengths in one step, chunked prompts, steady decoding,
// a sequence leaving (its slot refilled by the last one) and steps over a
// subset of the slots (moved together first).

const TOL = 1e-4;

describe('slot-cache graph and KvSlots', () => {
  for (const [heads, kvHeads] of [
    [8, 4],
    [4, 1],
    [4, 4],
  ] as const) {
    it(`matches the reference through joins, leaves and chunked prompts (${heads} heads, ${kvHeads} kv heads)`, async () => {
      const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: heads, nKvHeads: kvHeads, vocabSize: 64, seqLen: 160, seed: 5, std: 0.3 });
      const { sl, step, maxErr, tok } = await checkedSlotSteps(ck, buildLlamaOnnx(ck, { kvLayout: 'slots' }).model);
      // Prompts beside decoding rows, one in two chunks, then the middle sequence leaves.
      await promptsBesideDecoding(step, tok);
      expect(sl.delete(2)).toBe(true);
      expect(sl.has(2)).toBe(false);
      await step([4, 1, 3].map((seq) => ({ seq, tokens: tok(1, seq) })));
      // Rows that are not contiguous (1 and 4 with 3 between them), then a sequence that outgrows the capacity.
      await step([4, 1].map((seq) => ({ seq, tokens: tok(1, seq + 2) })));
      const before = sl.cap;
      await step([{ seq: 5, tokens: tok(1, 6) }]);
      await step([{ seq: 5, tokens: tok(before + 3, 7) }]);
      expect(sl.cap).toBeGreaterThan(before);
      await step([1, 3, 4, 5].map((seq) => ({ seq, tokens: tok(1, seq + 3) })));
      // The first slot's sequence leaves: the last slot's keys and values move into its place.
      sl.delete(sl.seqs()[0]!);
      await step([...sl.seqs()].map((seq) => ({ seq, tokens: tok(1, seq + 4) })));
      expect(maxErr()).toBeLessThan(TOL);
      for (const seq of [1, 3, 4, 5]) sl.delete(seq);
      // Empty, the buffers stay until released; a cache grown past what is kept starts smaller for a short next sequence.
      expect(sl.live).toBe(0);
      expect(sl.bytes).toBeGreaterThan(0);
      sl.open(6);
      sl.reserve(150);
      expect(sl.cap).toBeGreaterThan(128);
      sl.delete(6);
      sl.open(7);
      sl.reserve(10);
      expect(sl.cap).toBe(64);
      expect(sl.release()).toBe(false);
      sl.delete(7);
      expect(sl.release()).toBe(true);
      expect(sl.bytes).toBe(0);
    });
  }

  it("starts a sequence from a kept one's first positions (takeOut, putIn) as if it had run them, beside sequences decoding", async () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 160, seed: 9, std: 0.3 });
    const sess = await ort.InferenceSession.create(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model, { intraOpNumThreads: 1 });
    const sl = new KvSlots({ layers: 2, kvHeads: 2, headDim: headSize(ck.config), positionsMax: 160, emptyCacheFeeds: true });
    const { check, prime, maxErr, tok } = referenceSteps(ck);
    const step = async (rows: Array<{ seq: number; tokens: number[] }>) => {
      const st = slotStepFeeds(sl, rows);
      check(rows, slotStepDone(sl, st, await sess.run(st.feeds)), (seq) => sl.len(seq));
    };
    await promptsBesideDecoding(step, tok);
    // Sequence 2's tokens so far (promptsBesideDecoding: a 2-token prompt, then three decode steps).
    const two = [...tok(2, 2), ...[0, 1, 2].map((i) => tok(1, 2 + i)[0]!)];
    const len = sl.len(2);
    const arena = new KeptArena({ layers: 2, kvHeads: 2, headDim: headSize(ck.config), positionsMax: 160 }, 0);
    const kept = sl.takeOut(2, arena)!;
    expect([kept.len, sl.has(2), sl.live]).toEqual([len, false, 3]);
    expect(kept.extents).toEqual([{ block: 0, count: Math.ceil(len / KEPT_BLOCK_POSITIONS) }]);
    // Its first 4 positions start sequence 8, whose prompt goes on from there; all of them start sequence 9 in a cache grown meanwhile.
    sl.putIn(8, kept, 4, arena);
    prime(8, two.slice(0, 4));
    await step([{ seq: 8, tokens: tok(6, 8) }, { seq: 1, tokens: tok(1, 31) }, { seq: 3, tokens: tok(1, 33) }]);
    await step([{ seq: 5, tokens: tok(70, 5) }]);
    sl.putIn(9, kept, kept.len, arena);
    prime(9, two);
    await step([9, 8, 1].map((seq) => ({ seq, tokens: tok(1, seq + 40) })));
    expect(maxErr()).toBeLessThan(TOL);
    expect(() => sl.putIn(9, kept, 2, arena)).toThrow(/holds a slot already/);
    expect(() => sl.putIn(10, kept, kept.len + 1, arena)).toThrow(/has no first/);
    expect(sl.has(10)).toBe(false);
    expect(sl.takeOut(2, arena)).toBeUndefined();
    // A live sequence's opening, into this cache and into another of the same layout (KvPools' caches), beside decoding rows.
    const other = new KvSlots({ layers: 2, kvHeads: 2, headDim: headSize(ck.config), positionsMax: 160, emptyCacheFeeds: true });
    const nine = [...two, tok(1, 49)[0]!];
    sl.copyOpening(9, 10, 4);
    prime(10, nine.slice(0, 4));
    sl.copyOpening(9, 11, nine.length, other);
    prime(11, nine);
    await step([{ seq: 10, tokens: tok(3, 10) }, { seq: 9, tokens: tok(1, 50) }]);
    const st = slotStepFeeds(other, [{ seq: 11, tokens: tok(2, 11) }]);
    check([{ seq: 11, tokens: tok(2, 11) }], slotStepDone(other, st, await sess.run(st.feeds)), (seq) => other.len(seq));
    expect(maxErr()).toBeLessThan(TOL);
    expect(() => sl.copyOpening(9, 10, 2)).toThrow(/holds a slot already/);
    expect(() => sl.copyOpening(2, 12, 1)).toThrow(/holds 0 positions here, not 1/);
  });

  it('reads the per-layer outputs of folders converted before new_key_values (cloudgate-convert/4)', async () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 64, seed: 3, std: 0.3 });
    const sess = await ort.InferenceSession.create(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model, { intraOpNumThreads: 1 });
    const layout = { layers: 2, kvHeads: 2, headDim: headSize(ck.config), positionsMax: 64 };
    const [now, before] = [new KvSlots(layout), new KvSlots(layout)];
    const rows = [
      { seq: 1, tokens: [3, 4, 5] },
      { seq: 2, tokens: [6] },
    ];
    const st = slotStepFeeds(now, rows);
    slotStepFeeds(before, rows);
    const out = await sess.run(st.feeds);
    const all = out.new_key_values!;
    const [B, H, S, D] = [2, 2, st.S, layout.headDim];
    const perLayer: Record<string, ort.Tensor> = { logits: out.logits as ort.Tensor };
    for (let l = 0; l < 2; l++) {
      for (const [j, which] of ['key', 'value'].entries()) {
        const at = (2 * l + j) * B * H * S * D;
        perLayer[`new.${l}.${which}`] = new ort.Tensor('float32', (all.data as Float32Array).slice(at, at + B * H * S * D), [B, H, S, D]);
      }
    }
    expect(slotStepDone(before, st, perLayer)).toEqual(slotStepDone(now, st, out));
    for (const [name, view] of Object.entries(now.feeds(0, 2))) expect(before.feeds(0, 2)[name]).toEqual(view);
    expect(now.len(1)).toBe(3);
  });

  it("hides positions with the graph's own mask value", () => {
    expect(HIDDEN_BIAS).toBe(MASK_VALUE);
  });

  it('keeps an emptied cache of a small capacity for the next sequence, without reallocating', () => {
    const sl = new KvSlots({ layers: 1, kvHeads: 1, headDim: 4, positionsMax: 1000, emptyCacheFeeds: true });
    sl.open(1);
    sl.reserve(100);
    const views = sl.feeds(0, 1);
    sl.delete(1);
    sl.open(2);
    expect(sl.cap).toBe(112); // 64 -> 80 -> 96 -> 112: an eighth more each time, in multiples of 16
    expect(sl.len(2)).toBe(0);
    expect(sl.feeds(0, 1)['cache.0.key']!.buffer).toBe(views['cache.0.key']!.buffer);
  });

  it('keeps a grown cache for a next sequence as long, and rebuilds it smaller for a short one, never under a sequence with content', () => {
    const sl = new KvSlots({ layers: 1, kvHeads: 1, headDim: 4, positionsMax: 2000, emptyCacheFeeds: true });
    sl.open(1);
    sl.reserve(513);
    const cap = sl.cap;
    const buf = sl.feeds(0, 1)['cache.0.key']!.buffer;
    sl.delete(1);
    // The next 512-token prompt: no new buffers (they cost a lone long prompt ~10 ms at m25).
    sl.open(2);
    sl.reserve(512);
    expect(sl.cap).toBe(cap);
    expect(sl.feeds(0, 1)['cache.0.key']!.buffer).toBe(buf);
    // A second, short sequence beside the long one with its prompt written: the capacity stays (its keys are in it).
    sl.write(0, [512], 512, [new Float32Array(512 * 4)], [new Float32Array(512 * 4)]);
    sl.open(3);
    sl.reserve(5);
    expect(sl.cap).toBe(cap);
    sl.delete(2);
    sl.delete(3);
    // Empty again, and the next step needs 100 positions: more than 2x that is rebuilt, in SLOTS_MIN slots,
    // laid out in the memory the long sequence grew (held until released), so the next long one takes none.
    sl.open(4);
    sl.reserve(100);
    expect(sl.cap).toBe(112);
    expect(sl.feeds(0, 4)['cache.0.key']!.length).toBe(4 * 112 * 4);
    expect(sl.feeds(0, 1)['cache.0.key']!.buffer).toBe(buf);
    expect(sl.bytes).toBe(2 * 4 * cap * 4 * 4);
    sl.reserve(513);
    expect(sl.cap).toBe(cap);
    expect(sl.feeds(0, 1)['cache.0.key']!.buffer).toBe(buf);
    sl.delete(4);
    expect(sl.release()).toBe(true);
    expect(sl.bytes).toBe(0);
  });

  it('rebuilds a cache grown by a long sequence smaller once it has left, the short ones\' keys and values kept', () => {
    const sl = new KvSlots({ layers: 2, kvHeads: 2, headDim: 4, positionsMax: 2000, emptyCacheFeeds: true });
    const [H, D] = [2, 4];
    const fill = (n: number, base: number) => Float32Array.from({ length: H * n * D }, (_, i) => base + i);
    // A short sequence with 10 positions, then a long one of 600 beside it.
    sl.open(1);
    sl.reserve(10);
    sl.write(0, [10], 10, [fill(10, 0), fill(10, 1000)], [fill(10, 2000), fill(10, 3000)]);
    sl.open(2);
    sl.reserve(600);
    sl.write(1, [600], 600, [fill(600, 0), fill(600, 0)], [fill(600, 0), fill(600, 0)]);
    expect(sl.cap).toBeGreaterThanOrEqual(600);
    // While the long one lives the capacity stays.
    sl.reserve(11);
    expect(sl.cap).toBeGreaterThanOrEqual(600);
    sl.delete(2);
    // It has left: the short one's next step gets a capacity of its own size, its content where it was.
    sl.reserve(11);
    expect(sl.cap).toBe(64);
    expect(sl.len(1)).toBe(10);
    const views = sl.feeds(0, 1);
    for (const [name, base] of [['cache.0.key', 0], ['cache.1.key', 1000], ['cache.0.value', 2000], ['cache.1.value', 3000]] as const) {
      for (let h = 0; h < H; h++) {
        // slot 0, head h: positions 0..9 of the new capacity hold what the write put there
        expect(Array.from(views[name]!.subarray(h * 64 * D, h * 64 * D + 10 * D))).toEqual(Array.from(fill(10, base).subarray(h * 10 * D, (h + 1) * 10 * D)));
      }
    }
  });

  it('moves live positions within its memory as the capacity grows and shrinks, as a fresh cache would hold them', () => {
    const layout = { layers: 2, kvHeads: 3, headDim: 4, positionsMax: 4000, emptyCacheFeeds: true };
    const [H, D] = [layout.kvHeads, layout.headDim];
    const fill = (n: number, base: number) => Float32Array.from({ length: H * n * D }, (_, i) => base + i + 1);
    // Nearly full slots of 64 positions: a head moved to a capacity a little larger or smaller
    // lands on the next ones' positions, so the order of the moves decides what survives.
    const lens = [60, 41, 63, 50, 33];
    /** Sequences 1-5 with lens[i] positions each, written in one step per sequence (each its own slot). */
    const filled = (sl: KvSlots) => {
      lens.forEach((n, i) => {
        sl.open(i + 1);
        sl.reserve(n);
        sl.write(i, [n], n, [fill(n, 100 * i), fill(n, 100 * i + 10_000)], [fill(n, 100 * i + 20_000), fill(n, 100 * i + 30_000)]);
      });
    };
    /** Sequences 1-5's filled positions, head by head, per buffer. */
    const held = (sl: KvSlots) => {
      const views = sl.feeds(0, sl.live);
      return Object.fromEntries(Object.entries(views).map(([name, buf]) => [name, [1, 2, 3, 4, 5].map((seq) => Array.from({ length: H }, (_, h) => Array.from(buf.subarray((sl.seqs().indexOf(seq) * H + h) * sl.cap * D, ((sl.seqs().indexOf(seq) * H + h) * sl.cap + sl.len(seq)) * D))))]));
    };
    const fresh = new KvSlots(layout);
    filled(fresh);
    const want = held(fresh);
    // Six sequences grow the memory to 8 slots of over 1,000 positions and leave.
    const sl = new KvSlots(layout);
    for (let seq = 90; seq < 96; seq++) sl.open(seq);
    sl.reserve(1000);
    const [memory, buf] = [sl.bytes, sl.feeds(0, 1)['cache.0.key']!.buffer];
    for (let seq = 90; seq < 96; seq++) sl.delete(seq);
    filled(sl);
    expect(sl.cap).toBe(64);
    expect(held(sl)).toEqual(want);
    // A sixth grows the capacity to 144 (each head moved up), then leaves: shrunk to 64 again (each moved down).
    sl.open(100);
    sl.reserve(130);
    expect(sl.cap).toBe(144);
    expect(held(sl)).toEqual(want);
    sl.delete(100);
    sl.reserve(61);
    expect(sl.cap).toBe(64);
    expect(held(sl)).toEqual(want);
    expect([sl.bytes, sl.feeds(0, 1)['cache.0.key']!.buffer]).toEqual([memory, buf]);
  });

  it('keeps at most its first slots of the whole context past what its layout needs: more is given back when it shrinks', () => {
    const [H, D, L] = [2, 4, 2];
    const sl = new KvSlots({ layers: L, kvHeads: H, headDim: D, positionsMax: 1024, emptyCacheFeeds: true });
    const bytesOf = (slots: number, cap: number) => 2 * L * slots * H * cap * D * 4;
    // Eight sequences grown to the whole context together: 8 slots of 1,024, past 4 of it.
    for (let seq = 1; seq <= 8; seq++) sl.open(seq);
    sl.reserve(1000);
    expect(sl.bytes).toBe(bytesOf(8, 1024));
    for (let seq = 1; seq <= 8; seq++) sl.delete(seq);
    sl.open(9);
    sl.reserve(10);
    expect(sl.bytes).toBe(bytesOf(4, 64));
    // A lone long one: 4 slots of it, kept for the next after a short one.
    sl.reserve(1000);
    expect(sl.bytes).toBe(bytesOf(4, 1024));
    sl.delete(9);
    sl.open(10);
    sl.reserve(10);
    expect([sl.cap, sl.bytes]).toEqual([64, bytesOf(4, 1024)]);
  });

  it('answers exactly as a fresh cache does in memory that earlier sequences left their keys and values in', async () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 160, seed: 9, std: 0.3 });
    const sess = await ort.InferenceSession.create(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model, { intraOpNumThreads: 1 });
    const layout = { layers: 2, kvHeads: 2, headDim: headSize(ck.config), positionsMax: 160, emptyCacheFeeds: true };
    const { tok } = referenceSteps(ck);
    const stepper = (sl: KvSlots) => {
      const logits: Float32Array[] = [];
      const step = async (rows: Array<{ seq: number; tokens: number[] }>) => {
        const st = slotStepFeeds(sl, rows);
        logits.push(slotStepDone(sl, st, await sess.run(st.feeds)).slice());
      };
      return { logits, step };
    };
    const [fresh, used] = [new KvSlots(layout), new KvSlots(layout)];
    // Four prompts of 150 tokens fill every slot of the used cache's memory, and leave.
    const before = stepper(used);
    await before.step([1, 2, 3, 4].map((seq) => ({ seq: 100 + seq, tokens: tok(150, seq) })));
    for (const seq of [101, 102, 103, 104]) used.delete(seq);
    const memory = used.bytes;
    const [f, u] = [stepper(fresh), stepper(used)];
    for (const { step } of [f, u]) {
      await promptsBesideDecoding(step, tok);
      for (let i = 0; i < 3; i++) await step([1, 2, 3, 4].map((seq) => ({ seq, tokens: tok(1, seq + 10 + i) })));
    }
    // The same layout, laid in the used memory over the earlier keys: the same answers, to the bit.
    expect(used.cap).toBe(fresh.cap);
    expect(used.bytes).toBe(memory);
    expect(memory).toBeGreaterThan(fresh.bytes);
    expect(u.logits).toEqual(f.logits);
  });

  it("feeds a prompt chunk the capacity its cache held, and makes room for the chunk's positions after it", () => {
    const [H, D] = [2, 4];
    const sl = new KvSlots({ layers: 1, kvHeads: H, headDim: D, positionsMax: 2048, emptyCacheFeeds: true });
    const news = (n: number) => [new Float32Array(H * n * D)];
    const chunk = (n: number) => {
      const st = slotStepFeeds(sl, [{ seq: 1, tokens: Array.from({ length: n }, () => 5) }]);
      const fed = st.feeds['cache.0.key']!.dims[2];
      sl.write(st.first, st.counts, st.S, news(n), news(n));
      return fed;
    };
    // A 2,000-token prompt in chunks of 1,024 and 976: the first reads no cache and leaves the
    // capacity a fresh cache has for 1,024 positions; the second reads that, not 2,000.
    expect(chunk(1024)).toBe(0);
    expect(sl.cap).toBe(1104);
    expect(chunk(976)).toBe(1104);
    expect(sl.cap).toBeGreaterThanOrEqual(2000);
    expect(sl.len(1)).toBe(2000);
    // It leaves; the next prompt's first chunk lays the emptied cache out at its own size, in the same memory.
    const [memory, buf] = [sl.bytes, sl.feeds(0, 1)['cache.0.key']!.buffer];
    sl.delete(1);
    expect(chunk(1024)).toBe(0);
    expect(sl.cap).toBe(1104);
    expect([sl.bytes, sl.feeds(0, 1)['cache.0.key']!.buffer]).toEqual([memory, buf]);
  });

  it('grows the capacity by an eighth below 256 positions and by a quarter from there, in multiples of 16 positions', () => {
    const sl = new KvSlots({ layers: 1, kvHeads: 1, headDim: 4, positionsMax: 2000, emptyCacheFeeds: true });
    sl.open(1);
    const caps: number[] = [];
    for (const need of [64, 65, 81, 85, 97, 113, 241, 273, 1000]) {
      sl.reserve(need);
      caps.push(sl.cap);
    }
    // 16 rows of 20-token prompts and 64 tokens need 85 positions: 96, where x1.25 made 112
    expect(caps).toEqual([64, 80, 96, 96, 112, 128, 272, 352, 1104]);
  });

  it('grows no further than its live sequences can reach (rounded up to 8 positions), and as a fresh cache would where one has no bound', () => {
    const left = new Map<number, number>();
    const sl = new KvSlots({ layers: 1, kvHeads: 1, headDim: 4, positionsMax: 2000, emptyCacheFeeds: true, positionsLeft: (seq) => left.get(seq) });
    const caps = new Set<number>();
    const add = (seq: number, n: number) => {
      sl.reserve(sl.len(seq) + n);
      const blk = [new Float32Array(n * 4)];
      sl.write(sl.arrange([seq]).first, [n], n, blk, blk);
      caps.add(sl.cap);
    };
    sl.open(1);
    add(1, 20); // a 20-token prompt: no bound yet
    // Its generation of 64 tokens: 63 of them fed back, so it reaches 83 positions.
    for (left.set(1, 63); left.get(1)! > 0; left.set(1, left.get(1)! - 1)) add(1, 1);
    expect(sl.len(1)).toBe(83);
    // 64, then 80 (under its reach), then 88 where a fresh cache would take 96.
    expect([...caps]).toEqual([64, 80, 88]);
    // A sequence without a bound grows it as before: 90 positions take 96.
    sl.open(2);
    add(2, 90);
    expect(sl.cap).toBe(96);
    // Nor does a bound past the next capacity hold it back: 97 positions take 112.
    left.set(2, 0);
    left.set(3, 200);
    sl.open(3);
    add(3, 97);
    expect(sl.cap).toBe(112);
  });

  it('grows under its generations\' reach once between two fresh capacities, then on to the next one', () => {
    const left = new Map<number, number>();
    const sl = new KvSlots({ layers: 1, kvHeads: 1, headDim: 4, positionsMax: 2000, emptyCacheFeeds: true, positionsLeft: (seq) => left.get(seq) });
    const add = (seq: number, n: number) => {
      sl.reserve(sl.len(seq) + n);
      const blk = [new Float32Array(n * 4)];
      sl.write(sl.arrange([seq]).first, [n], n, blk, blk);
    };
    sl.open(1);
    add(1, 272);
    expect(sl.cap).toBe(272);
    // A generation reaching 290 takes the cache to 296, where the next fresh capacity is 352.
    left.set(1, 18);
    add(1, 1);
    expect(sl.cap).toBe(296);
    // Another reaching 310 passes 296: on to 352, not to 312 (and another regrowth at each reach after it).
    left.set(2, 310 - 296);
    sl.open(2);
    add(2, 296);
    expect(sl.cap).toBe(296);
    add(2, 1);
    expect(sl.cap).toBe(352);
  });

  it('refuses to grow a sequence past the model\'s positions', () => {
    const sl = new KvSlots({ layers: 1, kvHeads: 1, headDim: 4, positionsMax: 100, emptyCacheFeeds: true });
    sl.open(1);
    expect(() => sl.reserve(101)).toThrow(/101 positions passes the model's 100/);
    sl.reserve(100);
    expect(sl.cap).toBe(100);
  });
});
