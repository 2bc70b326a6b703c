import ort from 'onnxruntime-node';
import type { KeptArena, KeptKv, SlotView } from './kept-arena.js';

// The KV cache of a slot-cache graph (onnx-writer.ts `kvLayout: 'slots'`): per
// layer one key and one value buffer of [slots, kvHeads, capacity, headDim],
// each live sequence in one slot. A step's rows must sit in consecutive slots
// so that the graph reads them as one view, with no copy; the step's new keys
// and values are written once, at the row's next positions.

export interface SlotLayout {
  layers: number;
  kvHeads: number;
  headDim: number;
  /** Positions no sequence can pass (the model's context, its RoPE table). */
  positionsMax: number;
  /**
   * Whether a step may feed a cache of no positions (a first prompt chunk). onnxruntime's webgpu
   * provider (1.30) ends the process with SIGSEGV on one, so a GPU session gets the whole capacity,
   * hidden by cache_bias, instead.
   */
  emptyCacheFeeds: boolean;
  /**
   * Positions a sequence may still add at most (a generation's tokens left to feed back, from
   * its max_tokens); undefined: any, up to positionsMax. A cache grows no further than its live
   * sequences can reach (KvSlots.grownCapacity).
   */
  positionsLeft?: (seq: number) => number | undefined;
}

/** Capacity a fresh cache starts with; it grows as the longest sequence needs, up to the layout's positionsMax. */
const SLOT_CAPACITY_MIN_POSITIONS = 64;
/**
 * Each growth of the capacity: x1.125 below SLOT_CAPACITY_FINE_GROWTH_BELOW_POSITIONS, x1.25
 * from there, rounded up to a multiple of 16 positions. Attention reads the whole capacity of
 * every row each step, so what a capacity holds past the longest sequence is read for nothing:
 * 16 rows of m25 int4 (20-token prompts, 64 tokens each) need 85 positions, which x1.25 made
 * a capacity of 112 and x1.125 makes 96, and a decode step there took 8.53 ms against 9.24 at
 * 112 (two sleeping threads; 12.97 against 14.48 on one; bench/README.md "The slot capacity
 * grown finely"). Each regrowth copies the live positions once, and growth by an eighth copies
 * about twice as much over a sequence's life as growth by a quarter: below 256 positions that is
 * about 1,250 positions a slot in all (64 + 80 + ... + 240), so only short capacities grow finely.
 */
const SLOT_CAPACITY_FINE_GROWTH = 1.125;
const SLOT_CAPACITY_GROWTH = 1.25;
const SLOT_CAPACITY_FINE_GROWTH_BELOW_POSITIONS = 256;
const SLOT_CAPACITY_ALIGN_POSITIONS = 16;
/**
 * A capacity bounded by what the live sequences can reach is rounded up to this many positions,
 * so that sequences whose reaches differ by a few positions (prompts a token or two apart, the
 * same max_tokens) share one capacity instead of growing the cache, which copies every live
 * position, once each.
 */
const SLOT_CAPACITY_REACH_ALIGN_POSITIONS = 8;
/** Slots a fresh cache starts with; doubled when more sequences are live. */
const SLOTS_MIN = 4;
/**
 * The memory stays when the last sequence leaves (the worker frees it after a while idle):
 * allocating it again cost each lone request 1-1.6 ms before its prefill at m25's short
 * prompts, and ~10 ms at a 512-token one (bench/README.md). Attention reads the whole
 * capacity, so a cache whose capacity is over this many times what a step and its live
 * sequences need (and over KEPT_CAPACITY_MAX_POSITIONS) is laid out smaller: one grown by a
 * long sequence is rebuilt for the short ones after it, their positions moved once. Below that,
 * a cache whose sequences hold positions keeps its capacity (each rebuild moves them), and one
 * whose sequences hold none yet is laid out at a fresh cache's capacity (KvSlots.layFor).
 */
const KEPT_CAPACITY_OVER_NEED_MAX = 2;
/** Capacity a cache whose sequences hold positions keeps whatever they need: a short row then reads at most 2x what a fresh cache would give it. */
const KEPT_CAPACITY_MAX_POSITIONS = 2 * SLOT_CAPACITY_MIN_POSITIONS;
/** The most capacity a cache keeps for a step and live sequences that need `need` positions (KEPT_CAPACITY_OVER_NEED_MAX). */
const keptCapacity = (need: number) => Math.max(KEPT_CAPACITY_MAX_POSITIONS, KEPT_CAPACITY_OVER_NEED_MAX * need);

/** The capacity a cache grows to from `from` positions to hold `positions` (SLOT_CAPACITY_GROWTH), at most `positionsMax`. */
export function slotCapacityFor(positions: number, from: number, positionsMax: number): number {
  let cap = from;
  while (cap < positions) {
    const growth = cap < SLOT_CAPACITY_FINE_GROWTH_BELOW_POSITIONS ? SLOT_CAPACITY_FINE_GROWTH : SLOT_CAPACITY_GROWTH;
    cap = Math.ceil((cap * growth) / SLOT_CAPACITY_ALIGN_POSITIONS) * SLOT_CAPACITY_ALIGN_POSITIONS;
  }
  return Math.min(cap, positionsMax);
}

/** A fresh cache's capacity for `positions` (what a sequence of that many needs, rounded as the cache grows). */
export const freshSlotCapacity = (positions: number, positionsMax: number): number => slotCapacityFor(positions, SLOT_CAPACITY_MIN_POSITIONS, positionsMax);

/**
 * Copies each of `heads` heads' first `len` positions (of `headDim` floats) of a slot: from `src` at
 * float `from`, a slot of `fromCap` positions a head, to `dst` at `to`, one of `toCap`. What lies
 * past a slot's length is hidden by cache_bias (and finite: buffers start zeroed and only ever hold
 * keys and values), so moves copy filled positions only: at a capacity grown by a long sequence a
 * whole slot of m25 is 1.8 MB a buffer, 29 MB for the 16.
 */
export function copyHeads(heads: number, headDim: number, len: number, src: Float32Array, from: number, fromCap: number, dst: Float32Array, to: number, toCap: number): void {
  for (let h = 0; h < heads; h++) {
    const [a, b] = [from + h * fromCap * headDim, to + h * toCap * headDim];
    if (src === dst) dst.copyWithin(b, a, a + len * headDim);
    else dst.set(src.subarray(a, a + len * headDim), b);
  }
}

export class KvSlots {
  /** Each layer's keys and values in the current layout: views at the start of its chunk of `mem`. */
  private k: Float32Array[] = [];
  private v: Float32Array[] = [];
  /**
   * Every layer's key and value memory, one allocation of 2 x layers chunks (layer l's keys the
   * chunk 2l, its values 2l + 1) of `chunk` floats each. It stays at the most any layout has needed
   * (up to the first slots of the whole context: `resize`) until the cache is released (idle), as
   * llama.cpp holds its whole context: a capacity rebuilt smaller for short sequences and grown
   * again by the next long one moves the live positions within pages already written instead of
   * taking new ones. A 1,000-token prompt of m25 int4 after a short one took 128 MB of new buffers
   * before its step ran, 60-190 ms of page faults (bench/README.md "A long prompt after short
   * ones"). One allocation, not one a layer: past malloc's largest heap chunk (32 MiB) it is mapped
   * fresh, so a page costs only when first written, and a lone long prompt writes one slot of the
   * four. Positions no sequence holds keep an earlier one's keys and values where a fresh cache
   * held zeros: every graph hides them (cache_bias), so each weighs at most e^-60 of the row's
   * largest (onnx-attention.ts SOFTMAX_FLOOR), below float32's precision, and they are finite
   * (projections of RMS-normed states), so nothing of one sequence reaches another.
   */
  private mem = new Float32Array(0);
  private chunk = 0;
  private slotsCap = 0;
  /** Positions per slot (the graph's cache_capacity). */
  cap = 0;
  /** Sequence in each occupied slot; occupied slots are always 0 .. seqAt.length - 1. */
  private readonly seqAt: number[] = [];
  private readonly lenAt: number[] = [];
  private readonly slotOf = new Map<number, number>();
  private scratch = new Float32Array(0);

  /** @param slotsMin slots the buffers start with (SLOTS_MIN; a cache for a few long sequences takes fewer, each costs its whole capacity). */
  constructor(
    private readonly layout: SlotLayout,
    private readonly slotsMin = SLOTS_MIN,
  ) {}

  get layers(): number {
    return this.layout.layers;
  }
  get kvHeads(): number {
    return this.layout.kvHeads;
  }
  get headDim(): number {
    return this.layout.headDim;
  }
  get emptyCacheFeeds(): boolean {
    return this.layout.emptyCacheFeeds;
  }

  /** Bytes of the cache's memory (`mem`: at least its layout's): the KV bytes gauge. */
  get bytes(): number {
    return this.mem.byteLength;
  }

  private stride(cap = this.cap): number {
    return this.layout.kvHeads * cap * this.layout.headDim;
  }

  has(seq: number): boolean {
    return this.slotOf.has(seq);
  }

  len(seq: number): number {
    return this.lenAt[this.slotOf.get(seq)!]!;
  }

  /** The sequences holding a slot, in slot order (a view: it changes as they do). */
  seqs(): readonly number[] {
    return this.seqAt;
  }

  /** Sequences holding a slot. */
  get live(): number {
    return this.seqAt.length;
  }

  /** Gives `seq` the next free slot (an empty cache). */
  open(seq: number): void {
    if (this.slotOf.has(seq)) return;
    const slot = this.seqAt.length;
    if (slot >= this.slotsCap) this.resize(Math.max(this.slotsMin, this.slotsCap * 2), Math.max(this.cap, SLOT_CAPACITY_MIN_POSITIONS));
    this.seqAt.push(seq);
    this.lenAt.push(0);
    this.slotOf.set(seq, slot);
  }

  /** Drops a sequence; the last occupied slot moves into its place, so occupied slots stay contiguous. The buffers stay (see release). */
  delete(seq: number): boolean {
    const slot = this.slotOf.get(seq);
    if (slot === undefined) return false;
    this.slotOf.delete(seq);
    const last = this.seqAt.length - 1;
    if (slot !== last) this.move(last, slot);
    this.seqAt.pop();
    this.lenAt.pop();
    return true;
  }

  /** Frees the buffers when no sequence holds a slot; answers whether it did. */
  release(): boolean {
    if (this.seqAt.length || !this.slotsCap) return false;
    this.resize(0, 0);
    return true;
  }

  /**
   * Makes room for `positions` in every slot (laid out first as `layFor` lays it): grown as far as
   * its generations can reach (`grownCapacity`), or, for a prompt chunk (`chunk`), only to the
   * capacity a fresh cache would have for them, which its next chunk then reads whole.
   */
  reserve(positions: number, chunk = false): void {
    this.layFor(positions);
    if (positions <= this.cap) return;
    this.resize(this.slotsCap, chunk ? this.capacityFor(positions, SLOT_CAPACITY_MIN_POSITIONS) : this.grownCapacity(positions));
  }

  /**
   * Lays the cache out for a step whose rows will hold at most `positions`, growing it no further:
   * the step reads what its rows hold, and `write` makes room for its new positions once it has
   * run. Every row's attention reads the whole capacity, filled or not: a second 976-token chunk of
   * a 2,000-token prompt of m25 int4 took 223 ms over a capacity of 1,104 positions and 335 over
   * 2,048 (bench/README.md "A long prompt after short ones"). So where the capacity is far more
   * than the step and every live sequence need (see KEPT_CAPACITY_OVER_NEED_MAX), a smaller
   * layout: a cache grown by a long sequence that has left would slow every short one beside it
   * (16 rows of m25 int4 on the int8 products: a decode step 4.3 ms at a capacity of 64
   * positions, 5.4 at 112, 13.5 at 384; bench/README.md "The slot capacity"), the live sequences'
   * positions moved once. And a cache whose sequences hold nothing yet is laid out at a fresh
   * cache's capacity for the step: nothing moves, and its memory stays.
   */
  layFor(positions: number): void {
    if (positions > this.layout.positionsMax) throw new Error(`a sequence of ${positions} positions passes the model's ${this.layout.positionsMax}`);
    // Every step comes here (twice: its feeds and its write), so nothing is allocated.
    if (this.cap > keptCapacity(positions)) {
      const need = Math.max(positions, this.longest);
      if (this.cap > keptCapacity(need)) {
        let slots = this.slotsMin;
        while (slots < this.seqAt.length) slots *= 2;
        this.resize(slots, this.capacityFor(need, SLOT_CAPACITY_MIN_POSITIONS));
      }
    } else if (this.longest === 0) {
      const fresh = this.capacityFor(positions, SLOT_CAPACITY_MIN_POSITIONS);
      if (this.cap > fresh) this.resize(this.slotsCap, fresh);
    }
  }

  /**
   * The capacity a step that needs `positions` grows the cache to: the next of the capacities a
   * fresh cache grows through (SLOT_CAPACITY_FINE_GROWTH), but no further than the live sequences
   * can reach (SlotLayout.positionsLeft). Every row's attention reads the whole capacity: 16
   * streams of 64 tokens after a ~20-token prompt reach 84-89 positions, where the next capacity
   * is 96, and a decode step of m25 int4 read 96 where it needed 88 (16 streams 1.085x at a
   * capacity of 90 in a trial build; bench/README.md "Commands read between two steps").
   */
  private grownCapacity(positions: number): number {
    const next = this.capacityFor(positions, SLOT_CAPACITY_MIN_POSITIONS);
    // One bounded growth between two of the fresh capacities: a cache already held below one by
    // its generations' reach goes on to it, so that generations reaching ever further (mixed
    // max_tokens) do not regrow it, copying every live position, each time one passes the last.
    const bounded = this.cap !== this.capacityFor(this.cap, SLOT_CAPACITY_MIN_POSITIONS);
    const reach = bounded ? undefined : this.furthest();
    if (reach === undefined || reach >= next) return next;
    return Math.max(positions, Math.min(next, Math.ceil(reach / SLOT_CAPACITY_REACH_ALIGN_POSITIONS) * SLOT_CAPACITY_REACH_ALIGN_POSITIONS));
  }

  /** The most positions a live sequence can reach (SlotLayout.positionsLeft); undefined where one has no bound. */
  private furthest(): number | undefined {
    const left = this.layout.positionsLeft;
    if (!left) return undefined;
    let n = 0;
    for (let slot = 0; slot < this.seqAt.length; slot++) {
      const more = left(this.seqAt[slot]!);
      if (more === undefined) return undefined;
      n = Math.max(n, this.lenAt[slot]! + more);
    }
    return n;
  }

  private capacityFor(positions: number, from: number): number {
    return slotCapacityFor(positions, from, this.layout.positionsMax);
  }

  /** The live sequences' longest length. */
  get longest(): number {
    let n = 0;
    for (const len of this.lenAt) n = Math.max(n, len);
    return n;
  }

  /**
   * Rebuilds the buffers at the capacity a fresh cache would grow to for the live sequences'
   * next position, where that is smaller (the longest has just been handed over); the kept
   * capacity of `reserve` is for short sequences after a long one has left, not for this.
   */
  fit(): void {
    if (!this.seqAt.length) return;
    const cap = this.capacityFor(this.longest + 1, SLOT_CAPACITY_MIN_POSITIONS);
    if (cap < this.cap) this.resize(this.slotsCap, cap);
  }

  /** Moves a sequence's positions into `to` (a cache of the same layout) and drops it here. */
  handOver(seq: number, to: KvSlots): void {
    const from = this.slotOf.get(seq);
    if (from === undefined) throw new Error(`sequence ${seq} has no slot here`);
    const len = this.lenAt[from]!;
    to.open(seq);
    // Room for its next position too, unless it has reached the model's last (it is ending).
    to.reserve(Math.min(len + 1, this.layout.positionsMax));
    const { kvHeads: H, headDim: D } = this.layout;
    const [src, dst] = [from * this.stride(), to.slotOf.get(seq)! * to.stride()];
    for (let l = 0; l < this.layout.layers; l++) {
      copyHeads(H, D, len, this.k[l]!, src, this.cap, to.k[l]!, dst, to.cap);
      copyHeads(H, D, len, this.v[l]!, src, this.cap, to.v[l]!, dst, to.cap);
    }
    to.lenAt[to.slotOf.get(seq)!] = len;
    this.delete(seq);
  }

  /**
   * Moves a sequence's positions out of its slot into blocks of `arena` (its slot is freed, so the
   * live slots stay contiguous), for a later sequence to start from (`putIn`): a finished
   * generation kept for the next request that opens with the same tokens (scheduler.ts `kept prompts`).
   */
  takeOut(seq: number, arena: KeptArena): KeptKv | undefined {
    const slot = this.slotOf.get(seq);
    if (slot === undefined) return undefined;
    const kept = arena.keep({ k: this.k, v: this.v, offset: slot * this.stride(), cap: this.cap }, this.lenAt[slot]!);
    this.delete(seq);
    return kept;
  }

  /** Gives `seq` (not holding a slot) a slot holding the first `at` positions of `kept` (in `arena`). */
  putIn(seq: number, kept: KeptKv, at: number, arena: KeptArena): void {
    if (!(Number.isInteger(at) && at > 0 && at <= kept.len)) throw new Error(`a kept cache of ${kept.len} positions has no first ${at}`);
    this.openFrom(seq, at, (dst) => arena.restore(kept, at, dst));
  }

  /**
   * Gives `to` (not holding a slot) a slot of `dst` (this cache or another of the same layout) holding
   * the first `at` positions of live sequence `from` here: a prompt that opens with a running
   * generation's tokens starts from them (scheduler.ts). The positions a sequence holds never change.
   */
  copyOpening(from: number, to: number, at: number, dst: KvSlots = this): void {
    const len = this.slotOf.has(from) ? this.len(from) : 0;
    if (!(Number.isInteger(at) && at > 0 && at <= len)) throw new Error(`sequence ${from} holds ${len} positions here, not ${at}`);
    const { kvHeads: H, headDim: D } = this.layout;
    dst.openFrom(to, at, (into) => {
      // Read once the room is made: making it may rebuild these buffers, where `dst` is this cache (each slot keeps its place).
      const src = this.slotOf.get(from)! * this.stride();
      for (let l = 0; l < this.layout.layers; l++) {
        copyHeads(H, D, at, this.k[l]!, src, this.cap, into.k[l]!, into.offset, into.cap);
        copyHeads(H, D, at, this.v[l]!, src, this.cap, into.v[l]!, into.offset, into.cap);
      }
    });
  }

  /** Opens a slot for `seq` holding `at` positions, which `fill` copies into it once its room is made. */
  private openFrom(seq: number, at: number, fill: (slot: SlotView) => void): void {
    if (this.slotOf.has(seq)) throw new Error(`sequence ${seq} holds a slot already`);
    this.open(seq);
    // Room for the prompt's next position too, as for a chunk: the rest of the prompt follows.
    this.reserve(Math.min(at + 1, this.layout.positionsMax), true);
    const slot = this.slotOf.get(seq)!;
    fill({ k: this.k, v: this.v, offset: slot * this.stride(), cap: this.cap });
    this.lenAt[slot] = at;
  }

  /**
   * Puts `seqs` in consecutive slots, in slot order, moving other sequences
   * out of the way where there are gaps (only when the set of rows changed
   * around a sequence that is not stepping). Returns the first slot and the
   * indices of `seqs` in slot order.
   */
  arrange(seqs: number[]): { first: number; order: number[] } {
    const order = seqs.map((_, i) => i).sort((a, b) => this.slotOf.get(seqs[a]!)! - this.slotOf.get(seqs[b]!)!);
    const first = this.slotOf.get(seqs[order[0]!]!)!;
    if (this.slotOf.get(seqs[order.at(-1)!]!)! - first === seqs.length - 1) return { first, order };
    // The i-th smallest slot is at least i, so the sequence swapped out of slot i is never one of these rows.
    order.forEach((row, i) => {
      const from = this.slotOf.get(seqs[row]!)!;
      if (from !== i) this.swap(from, i);
    });
    return { first: 0, order };
  }

  /** The cache of slots [first, first + n) as the graph's inputs: views of the buffers, not copies. */
  feeds(first: number, n: number): Record<string, Float32Array> {
    const s = this.stride();
    const out: Record<string, Float32Array> = {};
    for (let l = 0; l < this.layout.layers; l++) {
      out[`cache.${l}.key`] = this.k[l]!.subarray(first * s, (first + n) * s);
      out[`cache.${l}.value`] = this.v[l]!.subarray(first * s, (first + n) * s);
    }
    return out;
  }

  /**
   * Writes a step's new keys and values (`new.N.key|value`, [n, kvHeads, S, headDim],
   * rows left-padded) into slots [first, first + n): row i's last `counts[i]`
   * positions go after what its slot holds, room made for them first (`reserve`).
   */
  write(first: number, counts: number[], S: number, newKeys: Float32Array[], newValues: Float32Array[]): void {
    let need = 0;
    for (let i = 0; i < counts.length; i++) need = Math.max(need, this.lenAt[first + i]! + counts[i]!);
    this.reserve(need, S > 1);
    const { kvHeads: H, headDim: D } = this.layout;
    const s = this.stride();
    // Source and destination of each layer's keys, then values: paired once per step, not per row.
    const pairs = [...newKeys.map((src, l) => [src, this.k[l]!] as const), ...newValues.map((src, l) => [src, this.v[l]!] as const)];
    for (let i = 0; i < counts.length; i++) {
      const slot = first + i;
      const n = counts[i]!;
      const at = this.lenAt[slot]!;
      if (at + n > this.cap) throw new Error(`slot ${slot} holds ${at} of ${this.cap} positions: no room for ${n} more`);
      for (const [src, dst] of pairs) {
        for (let h = 0; h < H; h++) {
          const from = ((i * H + h) * S + S - n) * D;
          dst.set(src.subarray(from, from + n * D), slot * s + (h * this.cap + at) * D);
        }
      }
      this.lenAt[slot] = at + n;
    }
  }

  private move(from: number, to: number): void {
    const [s, len, { kvHeads: H, headDim: D }] = [this.stride(), this.lenAt[from]!, this.layout];
    for (const buf of [...this.k, ...this.v]) copyHeads(H, D, len, buf, from * s, this.cap, buf, to * s, this.cap);
    this.relabel(to, this.seqAt[from]!, len);
  }

  private swap(a: number, b: number): void {
    const [s, cap, { kvHeads: H, headDim: D }] = [this.stride(), this.cap, this.layout];
    const [lenA, lenB] = [this.lenAt[a]!, this.lenAt[b]!];
    if (this.scratch.length < H * lenA * D) this.scratch = new Float32Array(s);
    for (const buf of [...this.k, ...this.v]) {
      copyHeads(H, D, lenA, buf, a * s, cap, this.scratch, 0, lenA);
      copyHeads(H, D, lenB, buf, b * s, cap, buf, a * s, cap);
      copyHeads(H, D, lenA, this.scratch, 0, lenA, buf, b * s, cap);
    }
    const seqA = this.seqAt[a]!;
    this.relabel(a, this.seqAt[b]!, lenB);
    this.relabel(b, seqA, lenA);
  }

  private relabel(slot: number, seq: number, len: number): void {
    this.seqAt[slot] = seq;
    this.lenAt[slot] = len;
    this.slotOf.set(seq, slot);
  }

  /**
   * Lays the cache out as `slots` x `cap`, each occupied slot's positions where that layout has
   * them: moved within the memory where it holds the layout, else copied into new memory of
   * exactly its size. `slots` 0 frees it all. Memory past what the layout needs is kept only up to
   * the cache's first slots of the whole context (a fresh cache's lone long prompt): more (many
   * rows grown long together) is given back as soon as a smaller layout is made, as before the
   * memory was kept.
   */
  private resize(slots: number, cap: number): void {
    const floats = slots * this.stride(cap);
    const L = slots ? this.layout.layers : 0;
    if (!slots) {
      [this.mem, this.chunk, this.scratch] = [new Float32Array(0), 0, new Float32Array(0)];
    } else if (this.chunk >= floats && this.chunk <= Math.max(floats, this.slotsMin * this.stride(this.layout.positionsMax))) {
      for (let c = 0; c < 2 * L; c++) this.relayout(this.mem.subarray(c * this.chunk, (c + 1) * this.chunk), cap);
    } else {
      const { kvHeads: H, headDim: D } = this.layout;
      const [oldCap, oldStride, newStride] = [this.cap, this.stride(), this.stride(cap)];
      const mem = new Float32Array(2 * L * floats);
      [...this.k, ...this.v].forEach((old, i) => {
        const at = (i < L ? 2 * i : 2 * (i - L) + 1) * floats;
        for (let slot = 0; slot < this.seqAt.length; slot++) copyHeads(H, D, this.lenAt[slot]!, old, slot * oldStride, oldCap, mem, at + slot * newStride, cap);
      });
      [this.mem, this.chunk] = [mem, floats];
    }
    this.k = Array.from({ length: L }, (_, l) => this.mem.subarray(2 * l * this.chunk, 2 * l * this.chunk + floats));
    this.v = Array.from({ length: L }, (_, l) => this.mem.subarray((2 * l + 1) * this.chunk, (2 * l + 1) * this.chunk + floats));
    this.slotsCap = slots;
    this.cap = cap;
  }

  /**
   * Moves each occupied slot's positions within `mem` from this capacity's layout to `cap`'s. Head
   * c (slot x kvHeads + head) starts at c x capacity x headDim in either, so growing moves every
   * head up and shrinking down: from the last head back when growing, from the first on when
   * shrinking, no head is written over before it has moved.
   */
  private relayout(mem: Float32Array, cap: number): void {
    if (cap === this.cap) return;
    const { kvHeads: H, headDim: D } = this.layout;
    const heads = this.seqAt.length * H;
    for (let i = 0; i < heads; i++) {
      const c = cap > this.cap ? heads - 1 - i : i;
      const from = c * this.cap * D;
      mem.copyWithin(c * cap * D, from, from + this.lenAt[Math.floor(c / H)]! * D);
    }
  }
}

/** The cache fed to a first prompt chunk, which reads none (one empty array, not one per layer and step). */
const NO_POSITIONS = new Float32Array(0);

/** Additive bias of hidden positions: the converter's MASK_VALUE (a test holds them equal), written here so the worker does not load the converter. */
export const HIDDEN_BIAS = -1e9;

/** A slot-cache step being run: its feeds, and where its rows sit. */
export interface SlotStep {
  feeds: Record<string, ort.Tensor>;
  first: number;
  /** Row indices in slot order. */
  order: number[];
  /** New tokens per row, in slot order. */
  counts: number[];
  S: number;
}

/**
 * A step's token and mask feeds, row i adding `rows[i].tokens` after the `rows[i].len` positions
 * its cache holds, in a cache of `C` positions a row: rows with fewer tokens than the longest (S)
 * are left-padded; new_bias hides the pads (a pad sees only itself, so no row of scores is all
 * hidden) and cache_bias every position a row has not filled.
 */
export function stepRowFeeds(rows: ReadonlyArray<{ tokens: readonly number[]; len: number }>, S: number, C: number): Record<string, ort.Tensor> {
  const B = rows.length;
  const ids = new BigInt64Array(B * S);
  const pos = new BigInt64Array(B * S);
  const cacheBias = new Float32Array(B * C).fill(HIDDEN_BIAS);
  const newBias = new Float32Array(B * S * S).fill(HIDDEN_BIAS);
  rows.forEach(({ tokens: toks, len }, i) => {
    const off = S - toks.length;
    cacheBias.fill(0, i * C, i * C + len);
    for (let j = 0; j < toks.length; j++) {
      ids[i * S + off + j] = BigInt(toks[j]!);
      pos[i * S + off + j] = BigInt(len + j);
    }
    for (let q = 0; q < S; q++) {
      const base = (i * S + q) * S;
      if (q < off) newBias[base + q] = 0;
      else newBias.fill(0, base + off, base + q + 1);
    }
  });
  return {
    input_ids: new ort.Tensor('int64', ids, [B, S]),
    position_ids: new ort.Tensor('int64', pos, [B, S]),
    cache_bias: new ort.Tensor('float32', cacheBias, [B, 1, 1, C]),
    new_bias: new ort.Tensor('float32', newBias, [B, 1, S, S]),
  };
}

/**
 * The feeds of a step where row i adds `rows[i].tokens` after what its slot
 * holds (a slot is opened for a new sequence): stepRowFeeds' and the slots' cache.
 */
export function slotStepFeeds(sl: KvSlots, rows: ReadonlyArray<{ seq: number; tokens: readonly number[] }>): SlotStep {
  for (const r of rows) sl.open(r.seq);
  sl.layFor(Math.max(...rows.map((r) => sl.len(r.seq) + r.tokens.length)));
  const { first, order } = sl.arrange(rows.map((r) => r.seq));
  const B = rows.length;
  const S = Math.max(...rows.map((r) => r.tokens.length));
  // Rows that all start empty (a first prompt chunk) read no cache: an empty one goes in, and the
  // step attends over its own tokens only instead of also over a capacity of hidden positions.
  const C = sl.emptyCacheFeeds && order.every((row) => sl.len(rows[row]!.seq) === 0) ? 0 : sl.cap;
  const feeds = stepRowFeeds(
    order.map((row) => ({ tokens: rows[row]!.tokens, len: sl.len(rows[row]!.seq) })),
    S,
    C,
  );
  for (const [name, view] of Object.entries(sl.feeds(first, B))) feeds[name] = new ort.Tensor('float32', C ? view : NO_POSITIONS, [B, sl.kvHeads, C, sl.headDim]);
  return { feeds, first, order, counts: order.map((row) => rows[row]!.tokens.length), S };
}

/** Writes the step's new keys and values into the slots; returns the last-position logits [B, V] in the rows' own order. */
export function slotStepDone(sl: KvSlots, step: SlotStep, out: ort.InferenceSession.OnnxValueMapType): Float32Array {
  // One `new_key_values` tensor, blocks of [B, kvHeads, S, headDim] in the order (layer, key | value);
  // the prefill and long-step graphs (prefill-graph.ts layerOutputs) and folders converted before it
  // (cloudgate-convert/4) return `new.N.key|value`.
  const all = out.new_key_values?.data as Float32Array | undefined;
  const block = step.order.length * sl.kvHeads * step.S * sl.headDim;
  const news = (which: 'key' | 'value') =>
    Array.from({ length: sl.layers }, (_, l) => {
      if (!all) return out[`new.${l}.${which}`]!.data as Float32Array;
      const at = (2 * l + (which === 'key' ? 0 : 1)) * block;
      return all.subarray(at, at + block);
    });
  sl.write(step.first, step.counts, step.S, news('key'), news('value'));
  const data = out.logits!.data as Float32Array;
  const V = Number(out.logits!.dims[2]);
  const logits = new Float32Array(data.length);
  step.order.forEach((row, i) => logits.set(data.subarray(i * V, (i + 1) * V), row * V));
  return logits;
}
