import { freshSlotCapacity, KvSlots, type SlotLayout } from './kv-slots.js';

// Every row of a slot-cache step reads its cache's whole capacity, and the capacity follows the
// longest sequence: beside one long conversation every short row read its length too (16 rows
// of m25 int4, 15 of them at 90 positions and one at 900: 23.4 ms a decode step, against 5.95
// for the 15 short rows alone and 2.23 for the long one; bench/README.md "Long rows apart").
// So sequences far longer than the rest are moved to a cache of their own, and a step runs its
// rows of each cache as two runs of the graph: each row then reads about its own length, at the
// cost of a second pass over the weights.

/**
 * A second run pays when the cache bytes it saves reading exceed the model's weight bytes this
 * many times: each run reads the weights once, each row its cache, and both are read at about
 * the memory's rate, the weights' blocks somewhat slower (m25 int4 on a Zen 5: the 15.6 MB of
 * weights in ~1.0 ms alone at one row, 118 MB of unfilled cache positions in ~4 ms).
 */
const SPLIT_SAVED_OVER_WEIGHT_BYTES_MIN = 2;
/** Moves between the caches a step at most: each copies a sequence's positions once. */
const MOVES_PER_STEP_MAX = 4;
/**
 * Slots the far cache starts with: it holds a long conversation or two, and each slot costs its
 * whole capacity, first touched when it grows (4 slots of m25 at 1,104 positions: 141 MB).
 */
const FAR_SLOTS_MIN = 1;

/** A step's rows as they run: the rows (indices of the step's rows) of each cache, one graph run each. */
export interface PoolRun {
  pool: KvSlots;
  rows: number[];
}

export class KvPools {
  /** Where sequences start, and most stay. */
  readonly near: KvSlots;
  /** Sequences far longer than the others. */
  readonly far: KvSlots;
  private readonly positionBytes: number;

  /**
   * @param weightBytes the model graph's weights (its file's size): what a second run costs.
   * @param split whether long sequences may move apart at all (KV_SPLIT_LONG_ROWS).
   */
  constructor(
    private readonly layout: SlotLayout,
    private readonly weightBytes: number,
    private readonly split = true,
  ) {
    this.near = new KvSlots(layout);
    this.far = new KvSlots(layout, FAR_SLOTS_MIN);
    this.positionBytes = 2 * layout.layers * layout.kvHeads * layout.headDim * 4;
  }

  poolOf(seq: number): KvSlots | undefined {
    return this.near.has(seq) ? this.near : this.far.has(seq) ? this.far : undefined;
  }
  has(seq: number): boolean {
    return this.poolOf(seq) !== undefined;
  }
  len(seq: number): number {
    return this.poolOf(seq)!.len(seq);
  }
  get live(): number {
    return this.near.live + this.far.live;
  }
  get bytes(): number {
    return this.near.bytes + this.far.bytes;
  }

  /** Drops a sequence; the buffers stay for the next (see release): a conversation's next turn is long too. */
  delete(seq: number): boolean {
    return this.near.delete(seq) || this.far.delete(seq);
  }

  /** Frees the buffers of both caches when no sequence holds a slot. */
  release(): boolean {
    const near = this.near.release();
    return this.far.release() || near;
  }

  /**
   * Opens the step's new sequences (in the near cache), moves sequences between the caches where
   * that pays, and answers the step's rows by cache: one run, or two.
   */
  plan(rows: ReadonlyArray<{ seq: number; tokens: readonly number[] }>): PoolRun[] {
    for (const r of rows) if (!this.has(r.seq)) this.near.open(r.seq);
    if (this.split) this.rebalance(rows);
    const near: number[] = [];
    const far: number[] = [];
    rows.forEach((r, i) => (this.near.has(r.seq) ? near : far).push(i));
    const runs: PoolRun[] = [];
    if (near.length) runs.push({ pool: this.near, rows: near });
    if (far.length) runs.push({ pool: this.far, rows: far });
    return runs;
  }

  private rebalance(rows: ReadonlyArray<{ seq: number; tokens: readonly number[] }>): void {
    const worth = this.weightBytes * SPLIT_SAVED_OVER_WEIGHT_BYTES_MIN;
    // Most steps: nothing apart, and even all but one row at the smallest capacity would not save
    // enough from the capacity the step leaves (its rows grow it before it runs).
    if (!this.far.live) {
      let stepNeed = 0;
      for (const r of rows) stepNeed = Math.max(stepNeed, this.near.len(r.seq) + r.tokens.length);
      const capacity = Math.max(this.near.cap, freshSlotCapacity(stepNeed, this.layout.positionsMax));
      if ((this.near.live - 1) * (capacity - freshSlotCapacity(1, this.layout.positionsMax)) * this.positionBytes <= worth) return;
    }
    const stepping = new Map(rows.map((r) => [r.seq, r.tokens.length]));
    // What each live sequence needs after this step (or its next one).
    const needs = (pool: KvSlots) => pool.seqs().map((seq) => ({ seq, need: pool.len(seq) + (stepping.get(seq) ?? 1) }));
    const cap = (positions: number) => freshSlotCapacity(positions, this.layout.positionsMax);
    let moved = false;
    for (let moves = 0; moves < MOVES_PER_STEP_MAX; moves++) {
      const near = needs(this.near).sort((a, b) => b.need - a.need);
      const far = needs(this.far);
      const farMax = Math.max(0, ...far.map((f) => f.need));
      if (near.length >= 2) {
        // The longest near sequence apart: the others then read up to the second longest's
        // capacity, the far ones up to its own; a first one apart costs a second run.
        const saved = (near.length - 1) * (cap(near[0]!.need) - cap(near[1]!.need)) * this.positionBytes;
        const costs = far.length ? far.length * Math.max(0, cap(near[0]!.need) - cap(farMax)) * this.positionBytes + worth / 2 : worth;
        if (saved > costs) {
          this.near.handOver(near[0]!.seq, this.far);
          moved = true;
          continue;
        }
      }
      // Back together once the near sequences have grown close to the far ones: the second run is
      // saved. Half the bytes that split them, so that a pair of sequences does not move back and forth.
      if (far.length && near.length && near.length * Math.max(0, cap(farMax) - cap(near[0]!.need)) * this.positionBytes < worth / 2) {
        for (const f of far) this.far.handOver(f.seq, this.near);
        this.far.release();
        moved = false;
      }
      break;
    }
    if (moved) this.near.fit();
  }
}
