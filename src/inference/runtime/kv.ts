import type { Tensor } from 'onnxruntime-node';

// The KV cache of every live sequence of one model, kept by its worker: per
// sequence and layer, a key and a value buffer of [kvHeads, capacity,
// headDim], grown by doubling.

export type KvBuffer = Float32Array | Uint16Array;

export interface KvLayout {
  layers: number;
  kvHeads: number;
  headDim: number;
  kvType: 'float32' | 'float16';
}

/**
 * A sequence's cache. A fork shares its parent's first `baseLen` positions
 * (copy-on-write: the parent's buffers are only read) and stores its own
 * positions from there on, so forking 64 question branches off one state
 * copies nothing.
 */
export interface Kv {
  len: number;
  cap: number;
  k: KvBuffer[];
  v: KvBuffer[];
  base?: Kv;
  baseLen: number;
  /** A prefix's cache as the branch graph's `prefix_key_values` feeds, built once for all its branch steps. */
  prefixFeeds?: { len: number; feeds: Record<string, Tensor> };
}

/** Bytes one cached position takes: keys and values of every layer. */
export function kvBytesPerPosition(layout: KvLayout): number {
  return 2 * layout.layers * layout.kvHeads * layout.headDim * (layout.kvType === 'float16' ? 2 : 4);
}

export class KvStore {
  private readonly caches = new Map<number, Kv>();
  /** Bytes held by every cache: the KV bytes gauge. */
  bytes = 0;

  constructor(private readonly layout: KvLayout) {}

  /** Sequences holding a cache. */
  get live(): number {
    return this.caches.size;
  }

  alloc(n: number): KvBuffer {
    return this.layout.kvType === 'float16' ? new Uint16Array(n) : new Float32Array(n);
  }

  private bytesOf(positions: number): number {
    return positions * kvBytesPerPosition(this.layout);
  }

  get(seq: number): Kv | undefined {
    return this.caches.get(seq);
  }

  has(seq: number): boolean {
    return this.caches.has(seq);
  }

  /** The sequence's cache, created empty with room for `cap` positions when it has none. */
  open(seq: number, cap: number): Kv {
    let kv = this.caches.get(seq);
    if (!kv) this.caches.set(seq, (kv = this.create(cap)));
    return kv;
  }

  private create(cap: number): Kv {
    const { layers, kvHeads, headDim } = this.layout;
    const n = kvHeads * cap * headDim;
    this.bytes += this.bytesOf(cap);
    return { len: 0, cap, k: Array.from({ length: layers }, () => this.alloc(n)), v: Array.from({ length: layers }, () => this.alloc(n)), baseLen: 0 };
  }

  /** New sequences that share `src`'s first `len` positions, all by default (read, never written). */
  fork(src: Kv, to: number[], len = src.len): void {
    for (const t of to) {
      const kv = this.create(16);
      kv.base = src;
      kv.baseLen = len;
      kv.len = len;
      this.caches.set(t, kv);
    }
  }

  /** Drops a sequence's cache; whatever forks still read of it stays with them. */
  delete(seq: number): boolean {
    const kv = this.caches.get(seq);
    if (!kv) return false;
    this.bytes -= this.bytesOf(kv.cap);
    return this.caches.delete(seq);
  }

  /** Copies positions [from, to) of head h (layer l) of a cache, the parents' part from the parents, to dst at dstOff. */
  copySpan(kv: Kv, l: number, which: 'key' | 'value', h: number, from: number, to: number, dst: KvBuffer, dstOff: number): void {
    const D = this.layout.headDim;
    if (kv.base && from < kv.baseLen) this.copySpan(kv.base, l, which, h, from, Math.min(to, kv.baseLen), dst, dstOff);
    const start = Math.max(from, kv.baseLen);
    if (to > start) {
      const src = which === 'key' ? kv.k[l]! : kv.v[l]!;
      dst.set(src.subarray((h * kv.cap + start - kv.baseLen) * D, (h * kv.cap + to - kv.baseLen) * D), dstOff + (start - from) * D);
    }
  }

  /** Makes room for `needTotal` positions in all (own capacity covers the positions past the shared base). */
  grow(kv: Kv, needTotal: number): void {
    const need = needTotal - kv.baseLen;
    if (need <= kv.cap) return;
    let cap = kv.cap;
    while (cap < need) cap *= 2;
    const { kvHeads: H, headDim: D } = this.layout;
    const re = (old: KvBuffer) => {
      const n = this.alloc(H * cap * D);
      for (let h = 0; h < H; h++) n.set(old.subarray(h * kv.cap * D, (h * kv.cap + kv.len - kv.baseLen) * D), h * cap * D);
      return n;
    };
    this.bytes += this.bytesOf(cap - kv.cap);
    kv.k = kv.k.map(re);
    kv.v = kv.v.map(re);
    kv.cap = cap;
  }
}
