import type { Cuts, LogitAdjust, TokenLogprob } from '../engine-api.js';

// Next-token choice from last-position logits: greedy at temperature 0
// (lowest id wins ties), else temperature-scaled softmax with nucleus (top_p)
// cut, drawn from a per-sequence PRNG so a seed reproduces a completion.

export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function argmax(l: Float32Array, off: number, n: number): number {
  let best = 0;
  let bv = l[off]!;
  for (let i = 1; i < n; i++) {
    const v = l[off + i]!;
    if (v > bv) {
      bv = v;
      best = i;
    }
  }
  return best;
}

const NO_CUTS: Cuts = { topK: 0, minP: 0 };

export function sample(l: Float32Array, off: number, n: number, temperature: number, topP: number, rand: () => number, cuts: Cuts = NO_CUTS): number {
  if (temperature <= 0) return argmax(l, off, n);
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (l[off + i]! > max) max = l[off + i]!;
  const p = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += p[i] = Math.exp((l[off + i]! - max) / temperature);
  if (topP < 1 || cuts.topK > 0 || cuts.minP > 0) {
    const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => p[b]! - p[a]! || a - b);
    const kMax = cuts.topK > 0 ? Math.min(cuts.topK, n) : n;
    const floor = cuts.minP * p[order[0]!]!;
    let acc = 0;
    let k = 0;
    // The most likely token always stays; then tokens while inside every cut.
    while (k < kMax && acc < topP * sum && (k === 0 || p[order[k]!]! >= floor)) acc += p[order[k++]!]!;
    const r = rand() * acc;
    let c = 0;
    for (let j = 0; j < k; j++) {
      c += p[order[j]!]!;
      if (r < c) return order[j]!;
    }
    return order[k - 1]!;
  }
  const r = rand() * sum;
  let c = 0;
  for (let i = 0; i < n; i++) {
    c += p[i]!;
    if (r < c) return i;
  }
  return n - 1;
}

/**
 * Applies `logit_bias` and the presence / frequency penalties (over the tokens
 * generated so far, `counts`) to one row, written into `out` (reused across
 * steps, so a step allocates nothing).
 */
export function adjustLogits(l: Float32Array, off: number, n: number, adj: LogitAdjust, counts: ReadonlyMap<number, number>, out: Float32Array): Float32Array {
  out.set(l.subarray(off, off + n));
  for (const [tok, b] of adj.bias) if (tok < n) out[tok] = out[tok]! + b;
  if (adj.presence !== 0 || adj.frequency !== 0) {
    for (const [tok, c] of counts) out[tok] = out[tok]! - adj.frequency * c - adj.presence;
  }
  return out;
}

/** log-softmax of one row, in float64 for the sum, returned as float32. */
export function logSoftmax(l: Float32Array, off: number, n: number): Float32Array {
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (l[off + i]! > max) max = l[off + i]!;
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(l[off + i]! - max);
  const lse = max + Math.log(sum);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = l[off + i]! - lse;
  return out;
}

/**
 * The log-probability of `tok` in one row of raw logits (the model's distribution, before
 * temperature, top_p and logit_bias, as OpenAI reports it) and the `k` most likely tokens
 * (ties: lower id first).
 */
export function tokenLogprob(l: Float32Array, off: number, n: number, tok: number, k: number): TokenLogprob {
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (l[off + i]! > max) max = l[off + i]!;
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(l[off + i]! - max);
  const lse = max + Math.log(sum);
  // k <= 20: keep a small sorted list instead of sorting the vocabulary.
  const top: Array<[number, number]> = [];
  for (let i = 0; k > 0 && i < n; i++) {
    const v = l[off + i]!;
    if (top.length === k && v <= top[k - 1]![1]) continue;
    let j = top.length < k ? top.length : k - 1;
    top[j] = [i, v];
    while (j > 0 && top[j - 1]![1] < v) {
      [top[j - 1], top[j]] = [top[j]!, top[j - 1]!];
      j--;
    }
  }
  return { logprob: l[off + tok]! - lse, top: top.map(([id, v]) => [id, v - lse]) };
}
