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

/** A kept generation's cache: its first `len` positions, in blocks of KEPT_BLOCK_POSITIONS, in order. */
export interface KeptKv {
  len: number;
  blocks: number[];
}

export interface KeptArenaLayout {
  layers: number;
  kvHeads: number;
  headDim: number;
}

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
  private readonly segments: Float32Array[] = [];
  /** Each block's segment and first float. */
  private readonly segmentOf: number[] = [];
  private readonly floatAt: number[] = [];
  /** Free blocks; the lowest first out, so keeps start on the pages the toucher reaches first. */
  private readonly free: number[] = [];
  private readonly blockFloats: number;
  private heldBytes = 0;

  /**
   * @param bytesMax the budget (CHAT_PREFIX_CACHE_MB): whole blocks of it are taken now and
   *   written once on a thread of their own (`touched`), so that no keep faults them in; the
   *   worker goes on loading meanwhile
   * @param onTouchError told why the pages could not be written ahead (each keep then faults its own)
   */
  constructor(
    private readonly layout: KeptArenaLayout,
    bytesMax: number,
    onTouchError: (message: string) => void = () => {},
  ) {
    this.blockFloats = 2 * layout.layers * layout.kvHeads * KEPT_BLOCK_POSITIONS * layout.headDim;
    const blocks = Math.floor(bytesMax / (this.blockFloats * 4));
    if (blocks === 0) return;
    const shared = new SharedArrayBuffer(blocks * this.blockFloats * 4);
    this.add(new Float32Array(shared), blocks);
    this.touched = new Promise<void>((resolve) => {
      const toucher = new Worker(TOUCHER_SOURCE, { eval: true, workerData: shared });
      toucher.unref();
      toucher.once('error', (e) => onTouchError(`kept generations' memory not written ahead (${e.message}); each keep faults its own pages`));
      toucher.once('exit', () => resolve());
    });
  }

  /** Resolves once the toucher is done with the budget's pages (at once where there is none). */
  readonly touched: Promise<void> = Promise.resolve();

  /** Bytes taken: the budget's blocks, and any taken past it (take). */
  get bytes(): number {
    return this.heldBytes;
  }

  /** Blocks no kept generation holds. */
  get freeBlocks(): number {
    return this.free.length;
  }

  /** Copies a slot's first `len` positions into blocks of their own. */
  keep(slot: SlotView, len: number): KeptKv {
    const kept = { len, blocks: this.take(Math.ceil(len / KEPT_BLOCK_POSITIONS)) };
    this.copy(kept.blocks, len, slot, true);
    return kept;
  }

  /** Copies a kept generation's first `at` positions (at most its `len`: KvSlots.putIn checks) into a slot. */
  restore(kept: KeptKv, at: number, slot: SlotView): void {
    this.copy(kept.blocks, at, slot, false);
  }

  /** Gives a kept generation's blocks back for later ones. */
  release(kept: KeptKv): void {
    for (let i = kept.blocks.length - 1; i >= 0; i--) this.free.push(kept.blocks[i]!);
    kept.blocks = [];
  }

  /**
   * `n` free blocks. Where the budget's are all held, more memory is taken: the worker keeps a
   * generation when it ends, before the scheduler has freed the least recently used ones that
   * make room for it (kept-prompts.ts trim), so the arena ends up holding the budget and what
   * keeps run ahead of their evictions, and reuses all of it from then on.
   */
  private take(n: number): number[] {
    if (this.free.length < n) this.add(new Float32Array((n - this.free.length) * this.blockFloats), n - this.free.length);
    const out: number[] = [];
    for (let i = 0; i < n; i++) out.push(this.free.pop()!);
    return out;
  }

  private add(segment: Float32Array, blocks: number): void {
    const s = this.segments.push(segment) - 1;
    const first = this.segmentOf.length;
    for (let b = 0; b < blocks; b++) {
      this.segmentOf.push(s);
      this.floatAt.push(b * this.blockFloats);
    }
    for (let b = blocks - 1; b >= 0; b--) this.free.push(first + b);
    this.heldBytes += segment.byteLength;
  }

  /** Between blocks (per layer: keys then values, each [kvHeads, KEPT_BLOCK_POSITIONS, headDim]) and a slot, `n` positions; `out`: slot to blocks. */
  private copy(blocks: number[], n: number, slot: SlotView, out: boolean): void {
    const { layers, kvHeads: H, headDim: D } = this.layout;
    const P = KEPT_BLOCK_POSITIONS;
    for (let i = 0; i * P < n; i++) {
      const [segment, base] = [this.segments[this.segmentOf[blocks[i]!]!]!, this.floatAt[blocks[i]!]!];
      const count = Math.min(P, n - i * P);
      const slotAt = slot.offset + i * P * D;
      for (let l = 0; l < layers; l++) {
        for (let j = 0; j < 2; j++) {
          const buf = (j ? slot.v : slot.k)[l]!;
          const blockAt = base + (2 * l + j) * H * P * D;
          if (out) copyHeads(H, D, count, buf, slotAt, slot.cap, segment, blockAt, P);
          else copyHeads(H, D, count, segment, blockAt, P, buf, slotAt, slot.cap);
        }
      }
    }
  }
}
