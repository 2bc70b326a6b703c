// Readers for Andrej Karpathy's llama2.c files: the legacy checkpoint `.bin`
// (seven int32 header fields, then float32 weights in run.c order) and the
// `tokenizer.bin` vocabulary (int32 max_token_length, then per token a float32
// score, an int32 byte length and the bytes).

export interface LlamaConfig {
  dim: number;
  hiddenDim: number;
  nLayers: number;
  nHeads: number;
  nKvHeads: number;
  vocabSize: number;
  seqLen: number;
  /** true when the classifier shares the token embedding table */
  sharedClassifier: boolean;
  /** RMSNorm epsilon; llama2.c uses 1e-5 */
  normEps: number;
  /** RoPE base; llama2.c uses 10000 */
  ropeTheta: number;
}

/**
 * Weights in llama2.c layout. Matrices are row-major [out, in] (PyTorch Linear),
 * stacked over layers: wq is [nLayers][dim][dim], wk/wv [nLayers][kvDim][dim],
 * wo [nLayers][dim][dim], w1/w3 [nLayers][hidden][dim], w2 [nLayers][dim][hidden].
 */
export interface LlamaWeights {
  tokenEmbedding: Float32Array; // [vocab][dim]
  rmsAtt: Float32Array; // [nLayers][dim]
  wq: Float32Array;
  wk: Float32Array;
  wv: Float32Array;
  wo: Float32Array;
  rmsFfn: Float32Array; // [nLayers][dim]
  w1: Float32Array;
  w2: Float32Array;
  w3: Float32Array;
  rmsFinal: Float32Array; // [dim]
  /** [vocab][dim]; the same array as tokenEmbedding when shared */
  wcls: Float32Array;
}

export interface LlamaCheckpoint {
  config: LlamaConfig;
  weights: LlamaWeights;
}

export const HEADER_BYTES = 7 * 4;

export function headSize(c: LlamaConfig): number {
  return c.dim / c.nHeads;
}

export function kvDim(c: LlamaConfig): number {
  return (c.dim * c.nKvHeads) / c.nHeads;
}

export function validateConfig(c: LlamaConfig): void {
  const ints: Array<keyof LlamaConfig> = ['dim', 'hiddenDim', 'nLayers', 'nHeads', 'nKvHeads', 'vocabSize', 'seqLen'];
  for (const k of ints) {
    const v = c[k] as number;
    if (!Number.isInteger(v) || v <= 0) throw new Error(`llama config: ${k} must be a positive integer, got ${v}`);
  }
  if (c.dim % c.nHeads !== 0) throw new Error(`llama config: dim ${c.dim} is not divisible by n_heads ${c.nHeads}`);
  if (c.nHeads % c.nKvHeads !== 0) throw new Error(`llama config: n_heads ${c.nHeads} is not divisible by n_kv_heads ${c.nKvHeads}`);
  if (headSize(c) % 2 !== 0) throw new Error(`llama config: head size ${headSize(c)} must be even for RoPE`);
}

/** Number of float32 values each weight tensor holds, in file order. */
export function weightSizes(c: LlamaConfig): Array<[keyof LlamaWeights | 'freqCisReal' | 'freqCisImag', number]> {
  const hs = headSize(c);
  const kd = kvDim(c);
  const L = c.nLayers;
  const sizes: Array<[keyof LlamaWeights | 'freqCisReal' | 'freqCisImag', number]> = [
    ['tokenEmbedding', c.vocabSize * c.dim],
    ['rmsAtt', L * c.dim],
    ['wq', L * c.dim * c.dim],
    ['wk', L * kd * c.dim],
    ['wv', L * kd * c.dim],
    ['wo', L * c.dim * c.dim],
    ['rmsFfn', L * c.dim],
    ['w1', L * c.hiddenDim * c.dim],
    ['w2', L * c.dim * c.hiddenDim],
    ['w3', L * c.hiddenDim * c.dim],
    ['rmsFinal', c.dim],
    ['freqCisReal', (c.seqLen * hs) / 2],
    ['freqCisImag', (c.seqLen * hs) / 2],
  ];
  if (!c.sharedClassifier) sizes.push(['wcls', c.vocabSize * c.dim]);
  return sizes;
}

export function parseCheckpoint(buf: Uint8Array): LlamaCheckpoint {
  if (buf.byteLength < HEADER_BYTES) throw new Error('llama2.c checkpoint: file too short for the header');
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  if (dv.getUint32(0, true) === 0x616b3432) {
    throw new Error('llama2.c checkpoint: this is a versioned ("ak42") export; only the legacy run.c format is supported');
  }
  const h = [0, 1, 2, 3, 4, 5, 6].map((i) => dv.getInt32(i * 4, true));
  const [dim, hiddenDim, nLayers, nHeads, nKvHeads, vocabRaw, seqLen] = h as [number, number, number, number, number, number, number];
  const config: LlamaConfig = {
    dim,
    hiddenDim,
    nLayers,
    nHeads,
    nKvHeads,
    vocabSize: Math.abs(vocabRaw),
    seqLen,
    sharedClassifier: vocabRaw > 0,
    normEps: 1e-5,
    ropeTheta: 10000,
  };
  validateConfig(config);
  const sizes = weightSizes(config);
  const total = sizes.reduce((a, [, n]) => a + n, 0);
  const need = HEADER_BYTES + total * 4;
  if (buf.byteLength < need) {
    throw new Error(`llama2.c checkpoint: expected at least ${need} bytes for the header's shapes, file has ${buf.byteLength}`);
  }
  // copy into an aligned buffer so Float32Array views are legal
  const floats = new Float32Array(total);
  new Uint8Array(floats.buffer).set(buf.subarray(HEADER_BYTES, need));
  const out: Partial<Record<string, Float32Array>> = {};
  let off = 0;
  for (const [name, n] of sizes) {
    out[name] = floats.subarray(off, off + n);
    off += n;
  }
  const w = out as unknown as LlamaWeights;
  if (config.sharedClassifier) w.wcls = w.tokenEmbedding;
  const weights: LlamaWeights = {
    tokenEmbedding: w.tokenEmbedding,
    rmsAtt: w.rmsAtt,
    wq: w.wq,
    wk: w.wk,
    wv: w.wv,
    wo: w.wo,
    rmsFfn: w.rmsFfn,
    w1: w.w1,
    w2: w.w2,
    w3: w.w3,
    rmsFinal: w.rmsFinal,
    wcls: w.wcls,
  };
  return { config, weights };
}

/** Serialise a checkpoint back to the legacy llama2.c layout (used by the generator and tests). */
export function serializeCheckpoint(ck: LlamaCheckpoint): Uint8Array {
  const c = ck.config;
  validateConfig(c);
  const sizes = weightSizes(c);
  const total = sizes.reduce((a, [, n]) => a + n, 0);
  const out = new Uint8Array(HEADER_BYTES + total * 4);
  const dv = new DataView(out.buffer);
  const header = [c.dim, c.hiddenDim, c.nLayers, c.nHeads, c.nKvHeads, c.sharedClassifier ? c.vocabSize : -c.vocabSize, c.seqLen];
  header.forEach((v, i) => dv.setInt32(i * 4, v, true));
  const f = new Float32Array(out.buffer, HEADER_BYTES, total);
  const hs = headSize(c);
  let off = 0;
  for (const [name, n] of sizes) {
    let src: Float32Array;
    if (name === 'freqCisReal' || name === 'freqCisImag') {
      src = new Float32Array(n);
      const half = hs / 2;
      for (let p = 0; p < c.seqLen; p++) {
        for (let i = 0; i < half; i++) {
          const freq = 1 / Math.pow(c.ropeTheta, (2 * i) / hs);
          src[p * half + i] = name === 'freqCisReal' ? Math.cos(p * freq) : Math.sin(p * freq);
        }
      }
    } else {
      src = ck.weights[name];
    }
    if (src.length !== n) throw new Error(`serializeCheckpoint: ${name} has ${src.length} values, expected ${n}`);
    f.set(src, off);
    off += n;
  }
  return out;
}

export interface Llama2cVocab {
  maxTokenLength: number;
  /** raw bytes of each piece */
  pieceBytes: Uint8Array[];
  /** pieces decoded as UTF-8 (llama2.c stores spaces as ' ', not '▁') */
  pieces: string[];
  scores: Float32Array;
}

export function parseTokenizerBin(buf: Uint8Array, vocabSize?: number): Llama2cVocab {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  if (buf.byteLength < 4) throw new Error('llama2.c tokenizer: file too short');
  const maxTokenLength = dv.getInt32(0, true);
  const pieceBytes: Uint8Array[] = [];
  const pieces: string[] = [];
  const scores: number[] = [];
  const dec = new TextDecoder('utf-8', { fatal: false });
  let off = 4;
  while (off < buf.byteLength && (vocabSize === undefined || pieces.length < vocabSize)) {
    if (off + 8 > buf.byteLength) throw new Error(`llama2.c tokenizer: truncated entry ${pieces.length}`);
    const score = dv.getFloat32(off, true);
    const len = dv.getInt32(off + 4, true);
    off += 8;
    if (len < 0 || off + len > buf.byteLength) throw new Error(`llama2.c tokenizer: bad length ${len} at entry ${pieces.length}`);
    const b = buf.slice(off, off + len);
    off += len;
    pieceBytes.push(b);
    pieces.push(dec.decode(b));
    scores.push(score);
  }
  if (vocabSize !== undefined && pieces.length !== vocabSize) {
    throw new Error(`llama2.c tokenizer: has ${pieces.length} tokens, the checkpoint expects ${vocabSize}`);
  }
  return { maxTokenLength, pieceBytes, pieces, scores: Float32Array.from(scores) };
}
