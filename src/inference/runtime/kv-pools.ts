import type { KeptArena, KeptKv } from './kept-arena.js';
import { freshSlotCapacity, KvSlots, type SlotLayout } from './kv-slots.js';

// Every row of a slot-cache step reads its cache's whole capacity, and the capacity follows the
// longest sequence: beside one long conversation every short row read its length too (16 rows
// of m25 int4, 15 of them at 90 positions and one at 900: 23.4 ms a decode step, against 5.95
// for the 15 short rows alone and 2.23 for the long one; bench/README.md "Long rows apart").
// So the live sequences are kept in a few caches by length, and a step runs its rows of each
// cache as a run of the graph: each row then reads about its own length, at the cost of another
// pass over the weights for each cache more.

/**
 * What one run of the graph costs, in bytes of cache read: this many times the model's weight
 * bytes. Each run reads the weights once, each row its cache, both at about the memory's rate,
 * the weights' blocks somewhat slower (m25 int4 on a Zen 5: the 15.6 MB of weights in ~1.0 ms
 * alone at one row, 118 MB of unfilled cache positions in ~4 ms).
 */
const RUN_COST_OVER_WEIGHT_BYTES = 2;
/**
 * What a run costs besides reading its weights, as weight bytes read in the same time: the
 * dispatch of a graph's ~240 small operators. A one-row step on one thread on a Zen 4 took
 * 0.355 / 2.137 / 6.288 ms for stories260K f32 / m25 int4 / m110 int4 (1.2 / 17.4 / 55.3 MB):
 * ~0.23 ms fixed and 0.11 ms a MB, so ~2 MB of weights' worth. Without it a small model's
 * second run was counted at a fraction of its cost (stories260K: 2.4 MB of cache read where the
 * run costs ~6.6), and its sequences were split where one run would have been faster.
 */
export const RUN_FIXED_COST_WEIGHT_BYTES = 2_000_000;
/**
 * The sequences move to a new grouping only when it reads this fraction of a run's cost less
 * than the one they are in: each move copies a sequence's positions once, and two groupings of
 * about the same cost must not take turns.
 */
const REGROUP_GAIN_OVER_RUN_COST_MIN = 0.25;
/** Caches at most, so runs a step at most: rows in four length classes each read within a few times their own length. */
const CACHES_MAX = 4;
/**
 * Slots the caches of longer sequences start with: they hold a few long conversations, and each
 * slot costs its whole capacity, first touched when it grows (4 slots of m25 at 1,104 positions: 141 MB).
 */
const LONG_CACHE_SLOTS_MIN = 1;

/** A step's rows as they run: the rows (indices of the step's rows) of each cache, one graph run each. */
export interface PoolRun {
  pool: KvSlots;
  rows: number[];
}

export class KvPools {
  /** The caches, shortest sequences first; new sequences start in the first. */
  readonly caches: KvSlots[];
  private readonly positionBytes: number;
  private readonly runBytes: number;

  /**
   * @param weightBytes the model graph's weights (its file's size): what another run reads again.
   * @param split whether sequences may be kept apart at all (KV_SPLIT_LONG_ROWS).
   * @param runFixedWeightBytes a run's own cost besides its weights (tests of tiny graphs set 0).
   */
  constructor(
    private readonly layout: SlotLayout,
    weightBytes: number,
    private readonly split = true,
    runFixedWeightBytes = RUN_FIXED_COST_WEIGHT_BYTES,
  ) {
    this.caches = Array.from({ length: split ? CACHES_MAX : 1 }, (_, i) => new KvSlots(layout, i ? LONG_CACHE_SLOTS_MIN : undefined));
    this.positionBytes = 2 * layout.layers * layout.kvHeads * layout.headDim * 4;
    this.runBytes = (weightBytes + runFixedWeightBytes) * RUN_COST_OVER_WEIGHT_BYTES;
  }

  /** The cache new sequences start in. */
  get near(): KvSlots {
    return this.caches[0]!;
  }

  poolOf(seq: number): KvSlots | undefined {
    return this.caches.find((c) => c.has(seq));
  }
  has(seq: number): boolean {
    return this.poolOf(seq) !== undefined;
  }
  len(seq: number): number {
    return this.poolOf(seq)!.len(seq);
  }
  get live(): number {
    return this.caches.reduce((n, c) => n + c.live, 0);
  }
  get bytes(): number {
    return this.caches.reduce((n, c) => n + c.bytes, 0);
  }

  /** Drops a sequence; the buffers stay for the next (see release): a conversation's next turn is long too. */
  delete(seq: number): boolean {
    return this.caches.some((c) => c.delete(seq));
  }

  /** Moves a sequence's positions out of its cache (KvSlots.takeOut). */
  takeOut(seq: number, arena: KeptArena): KeptKv | undefined {
    return this.poolOf(seq)?.takeOut(seq, arena);
  }

  /** A new sequence holding the first `at` positions of a kept cache, in the cache new sequences start in (KvSlots.putIn). */
  putIn(seq: number, kept: KeptKv, at: number, arena: KeptArena): void {
    this.near.putIn(seq, kept, at, arena);
  }

  /** A new sequence holding the first `at` positions of live sequence `from`, in the cache new sequences start in (KvSlots.copyOpening). */
  copyOpening(from: number, to: number, at: number): void {
    const pool = this.poolOf(from);
    if (!pool) throw new Error(`sequence ${from} holds no slot`);
    pool.copyOpening(from, to, at, this.near);
  }

  /** Frees the buffers of the caches no sequence holds a slot in; answers whether any were. */
  release(): boolean {
    return this.caches.map((c) => c.release()).some(Boolean);
  }

  /**
   * Opens the step's new sequences (in the first cache), moves sequences between the caches where
   * that pays, and answers the step's rows by cache: one run each.
   */
  plan(rows: ReadonlyArray<{ seq: number; tokens: readonly number[] }>): PoolRun[] {
    for (const r of rows) if (!this.has(r.seq)) this.near.open(r.seq);
    if (this.split) this.regroup(rows);
    if (this.near.live === this.live) return [{ pool: this.near, rows: rows.map((_, i) => i) }];
    const runs = this.caches.map((pool) => ({ pool, rows: [] as number[] }));
    rows.forEach((r, i) => runs.find((run) => run.pool.has(r.seq))!.rows.push(i));
    return runs.filter((run) => run.rows.length);
  }

  /**
   * Regroups the live sequences by length where that reads fewer bytes a step: the grouping of
   * their lengths (in order) into at most CACHES_MAX caches whose runs' cost plus every row's
   * capacity read is least, if it beats the present one by REGROUP_GAIN_OVER_RUN_COST_MIN runs.
   */
  private regroup(rows: ReadonlyArray<{ seq: number; tokens: readonly number[] }>): void {
    const cap = (positions: number) => freshSlotCapacity(positions, this.layout.positionsMax);
    // Most steps: one cache, and even all but one row at the smallest capacity would not save a run.
    if (this.near.live === this.live) {
      let stepNeed = 0;
      for (const r of rows) stepNeed = Math.max(stepNeed, this.near.len(r.seq) + r.tokens.length);
      const capacity = Math.max(this.near.cap, cap(stepNeed));
      if ((this.near.live - 1) * (capacity - cap(1)) * this.positionBytes <= this.runBytes) return;
    }
    const stepping = new Map(rows.map((r) => [r.seq, r.tokens.length]));
    // What each live sequence needs after this step (or its next one), shortest first.
    const seqs = this.caches
      .flatMap((c, at) => c.seqs().map((seq) => ({ seq, at, need: cap(c.len(seq) + (stepping.get(seq) ?? 1)) })))
      .sort((a, b) => a.need - b.need);
    const n = seqs.length;
    // A cache of sequences i..j-1 (in that order) costs a run and each row the capacity of the longest.
    const groupCost = (i: number, j: number) => this.runBytes + (j - i) * seqs[j - 1]!.need * this.positionBytes;
    const now = this.caches.reduce((t, c, at) => {
      const inIt = seqs.filter((s) => s.at === at);
      return inIt.length ? t + this.runBytes + inIt.length * inIt.at(-1)!.need * this.positionBytes : t;
    }, 0);
    // best[k][j]: the least cost of the first j sequences in k caches; from[k][j]: where its last cache starts.
    const best = Array.from({ length: this.caches.length + 1 }, () => new Array<number>(n + 1).fill(Infinity));
    const from = Array.from({ length: this.caches.length + 1 }, () => new Array<number>(n + 1).fill(0));
    best[0]![0] = 0;
    for (let k = 1; k <= this.caches.length; k++) {
      for (let j = 1; j <= n; j++) {
        for (let i = k - 1; i < j; i++) {
          const c = best[k - 1]![i]! + groupCost(i, j);
          if (c < best[k]![j]!) [best[k]![j], from[k]![j]] = [c, i];
        }
      }
    }
    let k = 1;
    for (let kk = 2; kk <= this.caches.length; kk++) if (best[kk]![n]! < best[k]![n]!) k = kk;
    if (best[k]![n]! > now - this.runBytes * REGROUP_GAIN_OVER_RUN_COST_MIN) return;
    // The caches in order of length: sequence i goes to the cache of its group.
    const to = new Array<number>(n);
    for (let j = n, g = k; g > 0; j = from[g]![j]!, g--) for (let i = from[g]![j]!; i < j; i++) to[i] = g - 1;
    // Longest first, so a cache gives its long sequences away before it takes shorter ones.
    for (let i = n - 1; i >= 0; i--) if (seqs[i]!.at !== to[i]) this.caches[seqs[i]!.at]!.handOver(seqs[i]!.seq, this.caches[to[i]!]!);
    for (const c of this.caches) if (c.live) c.fit();
    for (const c of this.caches) if (!c.live && c !== this.near) c.release();
  }
}
