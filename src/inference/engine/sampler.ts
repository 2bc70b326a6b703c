// Next-token choice from one row of logits.
// temperature 0: greedy argmax, ties to the lowest id (deterministic).
// temperature > 0: softmax(logits / temperature), cut to the nucleus (the most
// likely tokens whose mass reaches top_p, ties ordered by id), drawn with the
// sequence's own PRNG, so a seed reproduces a completion alone or in a batch.

/** A small seeded PRNG (sfc32, seeded through splitmix32); uniform in [0, 1). */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0;
  const mix = () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
  let a = mix();
  let b = mix();
  let c = mix();
  let d = mix();
  return () => {
    const t = (((a + b) | 0) + d) | 0;
    d = (d + 1) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) | 0;
    return (t >>> 0) / 4294967296;
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

export interface SampleParams {
  temperature: number;
  topP: number;
}

let scratch = new Float64Array(0);

/** Picks a token id from logits[off .. off+n). `rand` is only drawn from when temperature > 0 (once per token). */
export function sample(l: Float32Array, off: number, n: number, p: SampleParams, rand: () => number): number {
  if (!(p.temperature > 0)) return argmax(l, off, n);
  if (scratch.length < n) scratch = new Float64Array(n);
  const w = scratch;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (l[off + i]! > max) max = l[off + i]!;
  const inv = 1 / p.temperature;
  let sum = 0;
  for (let i = 0; i < n; i++) sum += w[i] = Math.exp((l[off + i]! - max) * inv);
  const r = rand();
  if (p.topP >= 1) return drawInOrder(w, n, r * sum);
  const nucleus = topPSet(w, n, p.topP * sum);
  let mass = 0;
  for (const i of nucleus) mass += w[i]!;
  let x = r * mass;
  for (const i of nucleus) {
    x -= w[i]!;
    if (x < 0) return i;
  }
  return nucleus[nucleus.length - 1]!;
}

function drawInOrder(w: Float64Array, n: number, x: number): number {
  let last = 0;
  for (let i = 0; i < n; i++) {
    if (w[i]! > 0) last = i;
    x -= w[i]!;
    if (x < 0) return i;
  }
  return last;
}

/**
 * The smallest set of most likely ids whose weight reaches `target`, most
 * likely first (ties: lower id first). Takes the top k candidates (k = 64,
 * then x4) and sorts only those, so a peaked distribution over a 32k
 * vocabulary costs a scan, not a full sort.
 */
export function topPSet(w: Float64Array, n: number, target: number): number[] {
  for (let k = Math.min(64, n); ; k = Math.min(n, k * 4)) {
    const top = topK(w, n, k);
    let acc = 0;
    for (let j = 0; j < top.length; j++) {
      acc += w[top[j]!]!;
      if (acc >= target) return top.slice(0, j + 1);
    }
    if (k === n) return top;
  }
}

const byWeight = (w: Float64Array) => (a: number, b: number) => w[b]! - w[a]! || a - b;

function topK(w: Float64Array, n: number, k: number): number[] {
  if (k >= n) return Array.from({ length: n }, (_, i) => i).sort(byWeight(w));
  // The k-th largest weight by a partial pass: keep a sorted buffer of k candidates.
  const cmp = byWeight(w);
  const buf: number[] = [];
  for (let i = 0; i < n; i++) {
    if (buf.length === k && cmp(i, buf[k - 1]!) >= 0) continue;
    // insertion into the sorted buffer (k is small compared with n)
    let lo = 0;
    let hi = buf.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cmp(buf[mid]!, i) <= 0) lo = mid + 1;
      else hi = mid;
    }
    buf.splice(lo, 0, i);
    if (buf.length > k) buf.pop();
  }
  return buf;
}

/** log-softmax of one row, summed in float64. */
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
