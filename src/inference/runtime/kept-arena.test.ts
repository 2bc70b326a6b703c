import { describe, expect, it } from 'vitest';
import { KeptArena, type SlotView } from './kept-arena.js';
import { KEPT_BLOCK_POSITIONS, keptBytesOf } from './kept-prompts.js';

const layout = { layers: 3, kvHeads: 2, headDim: 4, positionsMax: 2 ** 20 };
const bytesPerPosition = 2 * layout.layers * layout.kvHeads * layout.headDim * 4;
const blockBytes = KEPT_BLOCK_POSITIONS * bytesPerPosition;

/** Slot `slot` of a slot cache of `slots` x `cap` positions, each float its own value (slot, layer, k/v, head, position, dim). */
function slotCache(slots: number, cap: number, slot: number, fill = true): SlotView {
  const { layers, kvHeads: H, headDim: D } = layout;
  const buf = (j: number, l: number) => {
    const a = new Float32Array(slots * H * cap * D);
    if (fill) a.forEach((_, i) => (a[i] = ((j * layers + l) * 1e6 + i) % 16_777_216));
    return a;
  };
  return { k: Array.from({ length: layers }, (_, l) => buf(0, l)), v: Array.from({ length: layers }, (_, l) => buf(1, l)), offset: slot * H * cap * D, cap };
}

/** Every value of the first `n` positions of two slots, per layer, k/v and head. */
function opening(s: SlotView, n: number): number[] {
  const { kvHeads: H, headDim: D } = layout;
  const out: number[] = [];
  for (const bufs of [s.k, s.v]) for (const b of bufs) for (let h = 0; h < H; h++) out.push(...b.subarray(s.offset + h * s.cap * D, s.offset + (h * s.cap + n) * D));
  return out;
}

describe('kept arena', () => {
  it('keeps a slot’s positions in blocks and puts any opening of them back into a slot of another capacity', () => {
    const arena = new KeptArena(layout, 4 * blockBytes);
    const src = slotCache(3, 64, 1);
    const len = 2 * KEPT_BLOCK_POSITIONS + 5; // two whole blocks and part of a third
    const kept = arena.keep(src, len);
    expect(kept).toEqual({ len, extents: [{ block: 0, count: 3 }] });
    expect(arena.freeBlocks).toEqual({ blocks: 1, extents: 1 });
    for (const at of [len, KEPT_BLOCK_POSITIONS, 3]) {
      const dst = slotCache(2, 48, 1, false);
      arena.restore(kept, at, dst);
      expect(opening(dst, at)).toEqual(opening(src, at));
      // Nothing past `at` is written.
      expect(opening(dst, at + 1).slice(-layout.headDim).every((x) => x === 0)).toBe(true);
    }
  });

  it('reuses the blocks it is given back, and takes more memory only where the budget’s are all held', () => {
    const arena = new KeptArena(layout, 3 * blockBytes + blockBytes / 2);
    expect(arena.bytes).toBe(3 * blockBytes); // whole blocks of the budget
    const a = arena.keep(slotCache(1, 64, 0), 2 * KEPT_BLOCK_POSITIONS);
    const b = arena.keep(slotCache(1, 64, 0), KEPT_BLOCK_POSITIONS);
    expect(arena.freeBlocks.blocks).toBe(0);
    // A keep ahead of the eviction that makes room for it: more memory, once.
    const src = slotCache(2, 64, 1);
    const c = arena.keep(src, KEPT_BLOCK_POSITIONS + 1);
    expect(arena.bytes).toBe(5 * blockBytes);
    arena.release(a);
    arena.release(b);
    expect(a.extents).toEqual([]);
    // From then on the arena's own blocks serve: no more memory.
    const d = arena.keep(src, 3 * KEPT_BLOCK_POSITIONS);
    expect(arena.bytes).toBe(5 * blockBytes);
    const dst = slotCache(1, 80, 0, false);
    arena.restore(c, c.len, dst);
    expect(opening(dst, c.len)).toEqual(opening(src, c.len));
    arena.restore(d, d.len, dst);
    expect(opening(dst, d.len)).toEqual(opening(src, d.len));
  });

  it('keeps a generation in one run of free blocks where one holds it, else across several, and merges what comes back', () => {
    const arena = new KeptArena(layout, 10 * blockBytes);
    const src = slotCache(1, 12 * KEPT_BLOCK_POSITIONS, 0);
    const keep = (blocks: number) => arena.keep(src, blocks * KEPT_BLOCK_POSITIONS - 1);
    const [a, b, c] = [keep(3), keep(2), keep(3)];
    arena.release(a);
    arena.release(c);
    expect(arena.freeBlocks).toEqual({ blocks: 8, extents: 2 }); // 0-2, and 5-9 merged
    const d = keep(4);
    expect(d.extents).toEqual([{ block: 5, count: 4 }]); // the first run that holds it, not the first free block
    // 5 blocks where 4 are free (0-2, 9): one more is taken, and the generation spans three runs.
    const e = keep(5);
    expect(e.extents.map((x) => x.count).sort()).toEqual([1, 1, 3]);
    expect(arena.bytes).toBe(11 * blockBytes);
    for (const k of [d, e]) {
      const dst = slotCache(1, k.len, 0, false);
      arena.restore(k, k.len, dst);
      expect(opening(dst, k.len)).toEqual(opening(src, k.len));
    }
    for (const k of [b, d, e]) arena.release(k);
    // One run of the budget's blocks, and the block taken past it apart (another buffer).
    expect(arena.freeBlocks).toEqual({ blocks: 11, extents: 2 });
  });

  it('writes the budget’s pages on another thread without changing what keeps have written meanwhile', async () => {
    // 16 MiB: the thread is still starting, or writing, while the keeps below fill their blocks.
    const arena = new KeptArena(layout, 16 * 2 ** 20);
    const blocks = arena.bytes / blockBytes;
    const src = slotCache(1, 64 * KEPT_BLOCK_POSITIONS, 0);
    const kept = Array.from({ length: Math.floor(blocks / 64) }, () => arena.keep(src, 64 * KEPT_BLOCK_POSITIONS));
    await arena.touched;
    for (const k of kept.filter((_, i) => i % 7 === 0)) {
      const dst = slotCache(1, k.len, 0, false);
      arena.restore(k, k.len, dst);
      expect(opening(dst, k.len)).toEqual(opening(src, k.len));
    }
  });

  it('takes nothing with a budget under one block, and then memory as keeps come', async () => {
    const arena = new KeptArena(layout, blockBytes - 1);
    expect(arena.bytes).toBe(0);
    await arena.touched;
    arena.keep(slotCache(1, 64, 0), 3);
    expect(arena.bytes).toBe(blockBytes);
  });

  it('takes at most 64 whole contexts at load, and the rest of a larger budget as keeps come', () => {
    const arena = new KeptArena({ ...layout, positionsMax: 4 * KEPT_BLOCK_POSITIONS }, 1000 * blockBytes);
    expect(arena.bytes).toBe(64 * 4 * blockBytes);
    for (let i = 0; i < 70; i++) arena.keep(slotCache(1, 64, 0), 4 * KEPT_BLOCK_POSITIONS);
    expect(arena.bytes).toBe(70 * 4 * blockBytes);
  });

  it('counts a kept generation in whole blocks, as the scheduler’s budget does', () => {
    expect(keptBytesOf(1, bytesPerPosition)).toBe(blockBytes);
    expect(keptBytesOf(KEPT_BLOCK_POSITIONS, bytesPerPosition)).toBe(blockBytes);
    expect(keptBytesOf(KEPT_BLOCK_POSITIONS + 1, bytesPerPosition)).toBe(2 * blockBytes);
  });
});
