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

export function sample(l: Float32Array, off: number, n: number, temperature: number, topP: number, rand: () => number): number {
  if (temperature <= 0) return argmax(l, off, n);
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (l[off + i]! > max) max = l[off + i]!;
  const p = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += p[i] = Math.exp((l[off + i]! - max) / temperature);
  if (topP < 1) {
    const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => p[b]! - p[a]! || a - b);
    let acc = 0;
    let k = 0;
    while (k < n && acc < topP * sum) acc += p[order[k++]!]!;
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
