import { Worker } from 'node:worker_threads';
import { KEPT_BLOCK_POSITIONS } from './kept-prompts.js';
import { copyHeads } from './kv-slots.js';

// The memory of the finished generations a chat model's worker keeps (kept-prompts.ts), taken
// when the model loads, as llama.cpp and vLLM take their caches' memory at start, and reused as
// kept generations come and go: blocks of KEPT_BLOCK_POSITIONS positions, each holding every
// layer's keys and values of its positions.
//
// Why not new buffers for each kept generation: fresh memory costs a page fault a 4 KiB page
// when first written, ~12 us on this project's VMs, so keeping a 512-token generation of m25
// (16 MiB) took ~50 ms, in the worker, before its next step; and while the budget first filled,
// every keep's new memory also left the next prefill's outputs on fresh pages (~4,100 faults,
// ~40 ms more for a 512-token prompt). Measured in bench/README.md "Kept prompts' memory taken at load".

/** The slot cache's layout of a sequence: per layer [kvHeads, cap, headDim] from float `offset` (kv-slots.ts). */
export interface SlotView {
  k: Float32Array[];
  v: Float32Array[];
  offset: number;
  cap: number;
}

/** Blocks `block` .. `block + count - 1` of one segment, laid out as one: per layer keys then values, each [kvHeads, count * KEPT_BLOCK_POSITIONS, headDim]. */
export interface Extent {
  block: number;
  count: number;
}

/** A kept generation's cache: its first `len` positions, in extents of blocks, in order. */
export interface KeptKv {
  len: number;
  extents: Extent[];
}

export interface KeptArenaLayout {
  layers: number;
  kvHeads: number;
  headDim: number;
  /** The model's context: what one generation can hold at most. */
  positionsMax: number;
}

/**
 * At most this many whole contexts of the budget are taken at load; a budget that holds more
 * takes the rest as it fills. A small model's positions are cheap: stories260K's default budget
 * would hold ~200,000 positions, 400 of its contexts, and writing all of it ahead cost each
 * load ~0.7 s here (the test suite loads such models by the dozen). 64 contexts of m25 are 2 GiB,
 * past the default budget: at that size and up the whole default is taken.
 */
const KEPT_AT_LOAD_CONTEXTS_MAX = 64;

/**
 * Bytes between two pages the toucher writes: the kernel's page size on x86-64 and most arm64
 * kernels. A larger page is touched more than once, which costs nothing.
 */
const PAGE_BYTES = 4096;
/**
 * The toucher: writes each page of the arena once, by an atomic add of 0, so that a block the
 * worker has already filled keeps its values (a plain store of 0 could land after the worker's).
 */
const TOUCHER_SOURCE = `
const { workerData } = require('node:worker_threads');
const words = new Int32Array(workerData);
for (let i = 0; i < words.length; i += ${PAGE_BYTES / 4}) Atomics.add(words, i, 0);
`;

export class KeptArena {
  /** Each segment's floats and its first block; segments hold consecutive blocks, in order. */
  private readonly segments: Array<{ floats: Float32Array; first: number }> = [];
  private blocks = 0;
  /** Free extents by block, none adjacent within a segment (release merges them). */
  private readonly free: Extent[] = [];
  private readonly blockFloats: number;

  /**
   * @param bytesAtLoad the budget (CHAT_PREFIX_CACHE_MB; InitMsg.keptBytesAtLoad): whole blocks of
   *   it, up to KEPT_AT_LOAD_CONTEXTS_MAX contexts, are taken now and written once on a thread of
   *   its own (`touched`), so that no keep faults them in; the worker goes on loading meanwhile.
   *   More is taken as keeps need it (take).
   * @param onTouchError told why the pages could not be written ahead (each keep then faults its own)
   */
  constructor(
    private readonly layout: KeptArenaLayout,
    bytesAtLoad: number,
    onTouchError: (message: string) => void = () => {},
  ) {
    this.blockFloats = 2 * layout.layers * layout.kvHeads * KEPT_BLOCK_POSITIONS * layout.headDim;
    const blocks = Math.min(Math.floor(bytesAtLoad / (this.blockFloats * 4)), Math.ceil((KEPT_AT_LOAD_CONTEXTS_MAX * layout.positionsMax) / KEPT_BLOCK_POSITIONS));
    if (blocks === 0) return;
    const shared = new SharedArrayBuffer(blocks * this.blockFloats * 4);
    this.add(new Float32Array(shared));
    const unwritten = (e: Error) => onTouchError(`kept generations' memory not written ahead (${e.message}); each keep faults its own pages`);
    this.touched = new Promise<void>((resolve) => {
      try {
        const toucher = new Worker(TOUCHER_SOURCE, { eval: true, workerData: shared });
        toucher.unref();
        toucher.once('error', unwritten);
        toucher.once('exit', () => resolve());
      } catch (e) {
        // No thread to spare (a process at its limit): the arena serves all the same.
        unwritten(e as Error);
        resolve();
      }
    });
  }

  /** Resolves once the toucher is done with the budget's pages (at once where there is none). */
  readonly touched: Promise<void> = Promise.resolve();

  /** Bytes taken: the budget's blocks, and any taken past it (take). */
  get bytes(): number {
    return this.blocks * this.blockFloats * 4;
  }

  /** Blocks no kept generation holds, and the free extents they lie in. */
  get freeBlocks(): { blocks: number; extents: number } {
    return { blocks: this.free.reduce((n, e) => n + e.count, 0), extents: this.free.length };
  }

  /** Copies a slot's first `len` positions into blocks of their own. */
  keep(slot: SlotView, len: number): KeptKv {
    const kept = { len, extents: this.take(Math.ceil(len / KEPT_BLOCK_POSITIONS)) };
    this.copy(kept, len, slot, true);
    return kept;
  }

  /** Copies a kept generation's first `at` positions (at most its `len`: KvSlots.putIn checks) into a slot. */
  restore(kept: KeptKv, at: number, slot: SlotView): void {
    this.copy(kept, at, slot, false);
  }

  /** Gives a kept generation's blocks back for later ones. */
  release(kept: KeptKv): void {
    for (const e of kept.extents) this.give(e);
    kept.extents = [];
  }

  /**
   * `n` blocks: the first free extent that holds them all, so that a generation's copy is one run
   * per layer and head (a block a run costs ~3x the time of one copy: 600 positions of m25 kept in
   * 2.5-4.6 ms in blocks of 16, against 1.2-1.4 in one run), else the largest extents first. Where
   * the blocks taken so far are all held, more memory is taken: a budget larger than what was taken
   * at load fills this way, and the worker keeps a generation when it ends, before the scheduler has
   * freed the least recently used ones that make room for it (kept-prompts.ts trim), so the arena
   * ends up holding the budget and what keeps run ahead of their evictions, and reuses all of it
   * from then on.
   */
  private take(n: number): Extent[] {
    const whole = this.free.findIndex((e) => e.count >= n);
    if (whole >= 0) return [this.split(whole, n)];
    const short = n - this.freeBlocks.blocks;
    if (short > 0) this.add(new Float32Array(short * this.blockFloats));
    const out: Extent[] = [];
    for (let left = n; left > 0; ) {
      let i = 0;
      for (let j = 1; j < this.free.length; j++) if (this.free[j]!.count > this.free[i]!.count) i = j;
      const e = this.split(i, Math.min(left, this.free[i]!.count));
      out.push(e);
      left -= e.count;
    }
    return out;
  }

  /** The first `count` blocks of free extent `i`. */
  private split(i: number, count: number): Extent {
    const e = this.free[i]!;
    const taken = { block: e.block, count };
    if (count === e.count) this.free.splice(i, 1);
    else [e.block, e.count] = [e.block + count, e.count - count];
    return taken;
  }

  private give(e: Extent): void {
    let i = 0;
    while (i < this.free.length && this.free[i]!.block < e.block) i++;
    this.free.splice(i, 0, { ...e });
    // Merged with its neighbours where they are of the same segment (segments are separate buffers).
    const joins = (a: Extent, b: Extent) => a.block + a.count === b.block && !this.segments.some((s) => s.first === b.block);
    if (i + 1 < this.free.length && joins(this.free[i]!, this.free[i + 1]!)) this.free[i]!.count += this.free.splice(i + 1, 1)[0]!.count;
    if (i > 0 && joins(this.free[i - 1]!, this.free[i]!)) this.free[i - 1]!.count += this.free.splice(i, 1)[0]!.count;
  }

  private add(floats: Float32Array): void {
    const count = floats.length / this.blockFloats;
    this.segments.push({ floats, first: this.blocks });
    this.give({ block: this.blocks, count });
    this.blocks += count;
  }

  /** Between a kept generation's extents and a slot, `n` positions; `out`: slot to extents. */
  private copy(kept: KeptKv, n: number, slot: SlotView, out: boolean): void {
    const { layers, kvHeads: H, headDim: D } = this.layout;
    let from = 0;
    for (const e of kept.extents) {
      if (from >= n) break;
      const segment = this.segments.findLast((s) => s.first <= e.block)!;
      const cap = e.count * KEPT_BLOCK_POSITIONS;
      const count = Math.min(cap, n - from);
      const slotAt = slot.offset + from * D;
      for (let l = 0; l < layers; l++) {
        for (let j = 0; j < 2; j++) {
          const buf = (j ? slot.v : slot.k)[l]!;
          const at = (e.block - segment.first) * this.blockFloats + (2 * l + j) * H * cap * D;
          if (out) copyHeads(H, D, count, buf, slotAt, slot.cap, segment.floats, at, cap);
          else copyHeads(H, D, count, segment.floats, at, cap, buf, slotAt, slot.cap);
        }
      }
      from += cap;
    }
  }
}
