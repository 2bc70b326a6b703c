import fs from 'node:fs';
import ort from 'onnxruntime-node';
import { slotCapacityFor, stepRowFeeds } from './kv-slots.js';
import { growGraph, residentGraph, type ResidentLayout } from './resident-graph.js';
import { withRewrittenGraphConfig } from './external-data.js';
import { OPSET } from '../convert/onnx-writer.js';

// The KV cache of a chat model on a GPU provider, kept on the device (resident-graph.ts says why):
// one tensor [2 * layers * slots, kvHeads, capacity, headDim] that every step reads and returns
// updated, fed to the next step as it comes back. Only the bookkeeping is here: which slot
// each sequence holds and how many positions. A sequence that leaves frees its slot in place (the
// graph gathers each row's slot, so no slot moves); the tensor grows by the grow graph, and goes
// when no sequence is left (release).

/** Slots a fresh cache starts with; doubled when more sequences are live (kv-slots.ts SLOTS_MIN). */
const RESIDENT_SLOTS_MIN = 4;
/** Capacity a fresh cache starts with (kv-slots.ts SLOT_CAPACITY_MIN_POSITIONS). */
const RESIDENT_CAPACITY_MIN_POSITIONS = 64;
/**
 * Bytes the device tensor may take at most: it is one storage buffer, which the adapter bounds
 * (onnxruntime asks for the adapter's maxStorageBufferBindingSize; WebGPU's default is 128 MiB,
 * desktop Vulkan drivers give 2-4 GiB), and a step that fails on the device mid-stream once ended
 * the process. m25 fits 64 slots of its 1,024 positions, m110 16 (32 of up to 910; slots double).
 * Past it a step fails with this bound named, before it runs.
 */
export const RESIDENT_TENSOR_BYTES_MAX = 2 ** 31;

export interface ResidentSessions {
  /** The rewritten slot graph (residentGraph). */
  step: ort.InferenceSession;
  /** The grow graph (growGraph). */
  grow: ort.InferenceSession;
}

/**
 * The device-cache sessions of the slot graph in `modelPath`: the graph rewritten (resident-graph.ts)
 * and the grow graph, on `options`' provider, each handing its cache back on the device; `create`
 * makes a session (the worker's gives its threads their priority). Undefined where the file is no
 * slot-cache graph with one `new_key_values` output.
 */
export async function residentSessions(
  modelPath: string,
  layout: ResidentLayout,
  options: ort.InferenceSession.SessionOptions,
  create: (graph: Uint8Array, options: ort.InferenceSession.SessionOptions) => Promise<ort.InferenceSession> = (g, o) => ort.InferenceSession.create(g, o),
): Promise<ResidentSessions | undefined> {
  const graph = residentGraph(fs.readFileSync(modelPath), layout);
  if (!graph) return undefined;
  return {
    step: await create(graph, withRewrittenGraphConfig({ ...options, preferredOutputLocation: { logits: 'cpu', kv_cache_out: 'gpu-buffer' } }, modelPath)),
    grow: await create(growGraph(layout, OPSET), { ...options, preferredOutputLocation: { kv_cache_out: 'gpu-buffer' } }),
  };
}

export interface ResidentLayoutOf extends ResidentLayout {
  /** Positions no sequence can pass (the model's context, its RoPE table). */
  positionsMax: number;
}

export class ResidentSlots {
  private cache: ort.Tensor | undefined;
  private slotsCap = 0;
  /** Positions per slot (the graph's cache_capacity). */
  cap = 0;
  private readonly slotOf = new Map<number, number>();
  /** Positions each slot holds; a free slot's entry is stale. */
  private readonly lenAt: number[] = [];
  private readonly free: number[] = [];

  /** @param bytesMax RESIDENT_TENSOR_BYTES_MAX (tests set less). */
  constructor(
    private readonly layout: ResidentLayoutOf,
    private readonly sessions: ResidentSessions,
    private readonly bytesMax = RESIDENT_TENSOR_BYTES_MAX,
  ) {}

  get live(): number {
    return this.slotOf.size;
  }

  /** Bytes of the cache tensor: the KV bytes gauge (device memory here). */
  get bytes(): number {
    return this.bytesOf(this.slotsCap, this.cap);
  }

  private bytesOf(slots: number, cap: number): number {
    return 2 * this.layout.layers * slots * this.layout.kvHeads * cap * this.layout.headDim * 4;
  }

  /** Whether the tensor is on the device (a GPU provider's gpu-buffer), not back on the host. */
  get onDevice(): boolean {
    return this.cache?.location === 'gpu-buffer';
  }

  has(seq: number): boolean {
    return this.slotOf.has(seq);
  }

  len(seq: number): number {
    return this.lenAt[this.slotOf.get(seq)!]!;
  }

  delete(seq: number): boolean {
    const slot = this.slotOf.get(seq);
    if (slot === undefined) return false;
    this.slotOf.delete(seq);
    this.free.push(slot);
    return true;
  }

  /** Gives the device tensor back whatever the sequences (the worker is closing); the bookkeeping goes with it. */
  dispose(): void {
    this.slotOf.clear();
    this.release();
  }

  /** Frees the device tensor when no sequence holds a slot; answers whether it did. */
  release(): boolean {
    if (this.slotOf.size) return false;
    const had = !!this.cache;
    this.cache?.dispose();
    this.cache = undefined;
    // The slots too: a first step refused by the bound leaves slots numbered and no tensor.
    [this.slotsCap, this.cap, this.lenAt.length, this.free.length] = [0, 0, 0, 0];
    return had;
  }

  private open(seq: number): void {
    if (this.slotOf.has(seq)) return;
    // The lowest free slot, or the next never used (the tensor grows to hold it in reserve).
    let slot: number;
    if (this.free.length) {
      let i = 0;
      for (let j = 1; j < this.free.length; j++) if (this.free[j]! < this.free[i]!) i = j;
      slot = this.free.splice(i, 1)[0]!;
    } else {
      slot = this.lenAt.length;
      this.lenAt.push(0);
    }
    this.lenAt[slot] = 0;
    this.slotOf.set(seq, slot);
  }

  /**
   * One step: row i adds `rows[i].tokens` after what its sequence holds (a slot is opened for a new
   * one). Returns the last position's logits [B, V] in the rows' order. `run` runs the step graph.
   */
  async step(rows: ReadonlyArray<{ seq: number; tokens: readonly number[] }>, run: (feeds: Record<string, ort.Tensor>, tokens: number) => Promise<ort.InferenceSession.OnnxValueMapType>): Promise<Float32Array> {
    const { layers: L, kvHeads: KV, positionsMax } = this.layout;
    for (const r of rows) {
      const at = this.has(r.seq) ? this.len(r.seq) : 0;
      if (at + r.tokens.length > positionsMax) throw new Error(`a sequence of ${at + r.tokens.length} positions passes the model's ${positionsMax}`);
    }
    for (const r of rows) this.open(r.seq);
    const B = rows.length;
    const S = Math.max(...rows.map((r) => r.tokens.length));
    // A left-padded row's pads are written past its new positions (hidden by cache_bias, later
    // overwritten), each at a position of its own: so every row needs its length + S positions.
    let need = 0;
    for (const r of rows) need = Math.max(need, this.len(r.seq) + S);
    let slotsCap = Math.max(this.slotsCap, RESIDENT_SLOTS_MIN);
    while (slotsCap < this.lenAt.length) slotsCap *= 2;
    await this.reserve(slotsCap, need, this.lenAt.length);
    const C = this.cap;
    const feeds = stepRowFeeds(
      rows.map((r) => ({ tokens: r.tokens, len: this.len(r.seq) })),
      S,
      C,
    );
    const slots = rows.map((r) => this.slotOf.get(r.seq)!);
    const kvRows = new BigInt64Array(2 * L * B);
    const kvWrite = new BigInt64Array(2 * L * B * KV * S);
    // Written as the low halves of the int64s (little-endian; the high halves stay 0): every index is
    // under 2^31 (a row of the tensor, which RESIDENT_TENSOR_BYTES_MAX bounds), and a BigInt each
    // would be 16 K allocations a step at 64 rows of m110.
    const [rows32, write32] = [new Int32Array(kvRows.buffer), new Int32Array(kvWrite.buffer)];
    for (let t = 0; t < 2 * L; t++) {
      for (let b = 0; b < B; b++) {
        const slotRow = t * this.slotsCap + slots[b]!;
        rows32[2 * (t * B + b)] = slotRow;
        const [len, n] = [this.lenAt[slots[b]!]!, rows[b]!.tokens.length];
        for (let h = 0; h < KV; h++) {
          const base = (slotRow * KV + h) * C;
          const at = ((t * B + b) * KV + h) * S;
          // Token j of the S (left-padded by S - n) goes to position len + j - (S - n); a pad to len + n + j.
          for (let j = 0; j < S; j++) write32[2 * (at + j)] = base + (j >= S - n ? len + j - (S - n) : len + n + j);
        }
      }
    }
    feeds.kv_cache = this.cache!;
    feeds.kv_rows = new ort.Tensor('int64', kvRows, [2 * L, B]);
    feeds.kv_write = new ort.Tensor('int64', kvWrite, [2 * L * B, KV, S, 1]);
    const out = await run(feeds, B * S);
    this.replace(out.kv_cache_out!);
    rows.forEach((r, b) => (this.lenAt[slots[b]!]! += r.tokens.length));
    return out.logits!.data as Float32Array;
  }

  /**
   * Grows the tensor to `slots` slots of at least `positions` positions each (a fresh one the first
   * time); where that passes the bound, to the `slotsNeed` slots in use and `positions` exactly.
   */
  private async reserve(slots: number, positions: number, slotsNeed: number): Promise<void> {
    const { layers: L, kvHeads: KV, headDim: hd, positionsMax } = this.layout;
    let cap = positions <= this.cap ? this.cap : slotCapacityFor(positions, Math.max(this.cap, RESIDENT_CAPACITY_MIN_POSITIONS), Math.max(positionsMax, positions));
    if (this.cache && slots === this.slotsCap && cap === this.cap) return;
    if (this.bytesOf(slots, cap) > this.bytesMax) {
      [slots, cap] = [Math.max(slotsNeed, this.slotsCap), Math.max(positions, this.cap)];
      if (this.cache && slots === this.slotsCap && cap === this.cap) return;
    }
    const bytes = this.bytesOf(slots, cap);
    if (bytes > this.bytesMax) {
      throw new Error(`the KV cache on the device would take ${bytes} bytes (${slots} sequences' slots of ${cap} positions), over the ${this.bytesMax} one device buffer may hold; fewer concurrent sequences (batchSizeMax) or KV_ON_DEVICE=false (the cache on the host) serve them`);
    }
    if (!this.cache) {
      // The first tensor goes in from the host, zeroed (what lies past a slot's length is hidden, but must be finite).
      this.cache = new ort.Tensor('float32', new Float32Array(2 * L * slots * KV * cap * hd), [2 * L * slots, KV, cap, hd]);
    } else {
      const pads = BigInt64Array.from([0, 0, 0, 0, 0, 0, slots - this.slotsCap, 0, cap - this.cap, 0].map(BigInt));
      const out = await this.sessions.grow.run({ kv_cache: this.cache, pads: new ort.Tensor('int64', pads, [10]) });
      this.replace(out.kv_cache_out!);
    }
    [this.slotsCap, this.cap] = [slots, cap];
  }

  /** Takes a run's returned cache as the cache, giving the device back the one it replaced. */
  private replace(next: ort.Tensor): void {
    const old = this.cache;
    this.cache = next;
    if (old && old !== next) old.dispose();
  }
}
