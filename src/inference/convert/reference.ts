import { headSize, kvDim, type LlamaCheckpoint } from './llama2c.js';
import type { PieceVocab } from './tokenizer.js';

// A plain float32 port of llama2.c's run.c (forward pass and encode): the
// reference the converter and the daemon are checked against, token for token.

// ---------------------------------------------------------------------------
// Reference implementations ported from llama2.c run.c
// ---------------------------------------------------------------------------

const fr = Math.fround;

export function rmsnorm(o: Float32Array, x: Float32Array, w: Float32Array, wOff: number, n: number): void {
  let ss = 0;
  for (let j = 0; j < n; j++) ss = fr(ss + fr(x[j]! * x[j]!));
  ss = fr(ss / n);
  ss = fr(ss + 1e-5);
  ss = fr(1 / Math.sqrt(ss));
  for (let j = 0; j < n; j++) o[j] = w[wOff + j]! * fr(ss * x[j]!);
}

// W (d,n) @ x (n,) -> xout (d,)
export function matmul(xout: Float32Array, x: Float32Array, w: Float32Array, wOff: number, n: number, d: number): void {
  for (let i = 0; i < d; i++) {
    let val = 0;
    const base = wOff + i * n;
    for (let j = 0; j < n; j++) val = fr(val + fr(w[base + j]! * x[j]!));
    xout[i] = val;
  }
}

export function softmax(x: Float32Array, size: number): void {
  let max = x[0]!;
  for (let i = 1; i < size; i++) if (x[i]! > max) max = x[i]!;
  let sum = 0;
  for (let i = 0; i < size; i++) {
    x[i] = Math.exp(x[i]! - max);
    sum = fr(sum + x[i]!);
  }
  for (let i = 0; i < size; i++) x[i] = x[i]! / sum;
}

/** run.c's Transformer + forward(): one token at a time, float32 buffers. */
export class RefTransformer {
  private x: Float32Array;
  private xb: Float32Array;
  private xb2: Float32Array;
  private hb: Float32Array;
  private hb2: Float32Array;
  private q: Float32Array;
  private att: Float32Array;
  private keyCache: Float32Array;
  private valueCache: Float32Array;
  readonly logits: Float32Array;
  constructor(private ck: LlamaCheckpoint) {
    const p = ck.config;
    const kd = kvDim(p);
    this.x = new Float32Array(p.dim);
    this.xb = new Float32Array(p.dim);
    this.xb2 = new Float32Array(p.dim);
    this.hb = new Float32Array(p.hiddenDim);
    this.hb2 = new Float32Array(p.hiddenDim);
    this.q = new Float32Array(p.dim);
    this.att = new Float32Array(p.nHeads * p.seqLen);
    this.keyCache = new Float32Array(p.nLayers * p.seqLen * kd);
    this.valueCache = new Float32Array(p.nLayers * p.seqLen * kd);
    this.logits = new Float32Array(p.vocabSize);
  }
  forward(token: number, pos: number): Float32Array {
    const p = this.ck.config;
    const w = this.ck.weights;
    const { x, xb, xb2, hb, hb2, q, att } = this;
    const dim = p.dim;
    const kd = kvDim(p);
    const kvMul = p.nHeads / p.nKvHeads;
    const hidden = p.hiddenDim;
    const hs = headSize(p);
    x.set(w.tokenEmbedding.subarray(token * dim, (token + 1) * dim));
    for (let l = 0; l < p.nLayers; l++) {
      rmsnorm(xb, x, w.rmsAtt, l * dim, dim);
      const loff = l * p.seqLen * kd;
      const k = this.keyCache.subarray(loff + pos * kd, loff + (pos + 1) * kd);
      const v = this.valueCache.subarray(loff + pos * kd, loff + (pos + 1) * kd);
      matmul(q, xb, w.wq, l * dim * dim, dim, dim);
      matmul(k, xb, w.wk, l * dim * kd, dim, kd);
      matmul(v, xb, w.wv, l * dim * kd, dim, kd);
      for (let i = 0; i < dim; i += 2) {
        const headDim = i % hs;
        const freq = fr(1 / fr(Math.pow(10000, fr(headDim / hs))));
        const val = fr(pos * freq);
        const fcr = fr(Math.cos(val));
        const fci = fr(Math.sin(val));
        const rotn = i < kd ? 2 : 1;
        for (let vv = 0; vv < rotn; vv++) {
          const vec = vv === 0 ? q : k;
          const v0 = vec[i]!;
          const v1 = vec[i + 1]!;
          vec[i] = fr(v0 * fcr) - fr(v1 * fci);
          vec[i + 1] = fr(v0 * fci) + fr(v1 * fcr);
        }
      }
      for (let h = 0; h < p.nHeads; h++) {
        const qh = h * hs;
        const a = att.subarray(h * p.seqLen, (h + 1) * p.seqLen);
        for (let t = 0; t <= pos; t++) {
          const kb = loff + t * kd + Math.floor(h / kvMul) * hs;
          let score = 0;
          for (let i = 0; i < hs; i++) score = fr(score + fr(q[qh + i]! * this.keyCache[kb + i]!));
          a[t] = score / Math.sqrt(hs);
        }
        softmax(a, pos + 1);
        const out = xb.subarray(qh, qh + hs);
        out.fill(0);
        for (let t = 0; t <= pos; t++) {
          const vb = loff + t * kd + Math.floor(h / kvMul) * hs;
          const at = a[t]!;
          for (let i = 0; i < hs; i++) out[i] = out[i]! + fr(at * this.valueCache[vb + i]!);
        }
      }
      matmul(xb2, xb, w.wo, l * dim * dim, dim, dim);
      for (let i = 0; i < dim; i++) x[i] = x[i]! + xb2[i]!;
      rmsnorm(xb, x, w.rmsFfn, l * dim, dim);
      matmul(hb, xb, w.w1, l * dim * hidden, dim, hidden);
      matmul(hb2, xb, w.w3, l * dim * hidden, dim, hidden);
      for (let i = 0; i < hidden; i++) {
        let val = hb[i]!;
        val = fr(val * fr(1 / (1 + Math.exp(-val))));
        hb[i] = fr(val * hb2[i]!);
      }
      matmul(xb, hb, w.w2, l * dim * hidden, hidden, dim);
      for (let i = 0; i < dim; i++) x[i] = x[i]! + xb[i]!;
    }
    rmsnorm(x, x, w.rmsFinal, 0, dim);
    matmul(this.logits, x, w.wcls, 0, dim, p.vocabSize);
    return this.logits;
  }
}

/** Several sequences run through the reference, each at its own position: what a batched step's rows must match. */
export class RefSequences {
  private readonly seqs = new Map<number, { ref: RefTransformer; pos: number }>();
  constructor(private readonly ck: LlamaCheckpoint) {}

  /** Feeds `tokens` to `seq` (a new one starts at position 0); answers the last one's logits. */
  feed(seq: number, tokens: number[]): Float32Array {
    let s = this.seqs.get(seq);
    if (!s) this.seqs.set(seq, (s = { ref: new RefTransformer(this.ck), pos: 0 }));
    let logits: Float32Array = new Float32Array(0);
    for (const t of tokens) logits = s.ref.forward(t, s.pos++);
    return logits;
  }

  /** Positions `seq` has run. */
  len(seq: number): number {
    return this.seqs.get(seq)?.pos ?? 0;
  }
}

/** run.c's encode(): dummy prefix, per-codepoint lookup with byte fallback (+3), greedy best-score merges. */
export function refEncode(v: PieceVocab, text: string, bos: boolean, eos: boolean): number[] {
  const lookup = new Map<string, number>();
  v.pieces.forEach((p, i) => {
    if (!lookup.has(p)) lookup.set(p, i);
  });
  const bytes = new TextEncoder().encode(text);
  const dec = new TextDecoder();
  const tokens: number[] = [];
  if (bos) tokens.push(1);
  if (bytes.length > 0) tokens.push(lookup.get(' ')!);
  let buf: number[] = [];
  for (let c = 0; c < bytes.length; c++) {
    if ((bytes[c]! & 0xc0) !== 0x80) buf = [];
    buf.push(bytes[c]!);
    if (c + 1 < bytes.length && (bytes[c + 1]! & 0xc0) === 0x80 && buf.length < 4) continue;
    const id = lookup.get(dec.decode(Uint8Array.from(buf)));
    if (id !== undefined) tokens.push(id);
    else for (const b of buf) tokens.push(b + 3);
    buf = [];
  }
  for (;;) {
    let bestScore = -1e10;
    let bestId = -1;
    let bestIdx = -1;
    for (let i = 0; i < tokens.length - 1; i++) {
      const id = lookup.get(v.pieces[tokens[i]!]! + v.pieces[tokens[i + 1]!]!);
      if (id !== undefined && v.scores[id]! > bestScore) {
        bestScore = v.scores[id]!;
        bestId = id;
        bestIdx = i;
      }
    }
    if (bestIdx === -1) break;
    tokens.splice(bestIdx, 2, bestId);
  }
  if (eos) tokens.push(2);
  return tokens;
}

export function argmax(a: ArrayLike<number>, off = 0, n = a.length): number {
  let best = 0;
  for (let i = 1; i < n; i++) if (a[off + i]! > a[off + best]!) best = i;
  return best;
}

export function refGreedy(ck: LlamaCheckpoint, prompt: number[], steps: number): number[] {
  const t = new RefTransformer(ck);
  const out: number[] = [];
  let logits!: Float32Array;
  for (let pos = 0; pos < prompt.length; pos++) logits = t.forward(prompt[pos]!, pos);
  let pos = prompt.length;
  for (let i = 0; i < steps; i++) {
    const next = argmax(logits);
    out.push(next);
    logits = t.forward(next, pos++);
  }
  return out;
}

// ---------------------------------------------------------------------------
// ONNX helpers
// ---------------------------------------------------------------------------

