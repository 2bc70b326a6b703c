// Seeded random-weight models of the llama2.c architecture, and a small
// self-contained SentencePiece-style vocabulary for them (so nothing outside
// the repository is needed). Same seed and shapes -> byte-identical output.
import type { LlamaCheckpoint, LlamaConfig, LlamaWeights } from './llama2c.js';
import { kvDim, validateConfig } from './llama2c.js';
import type { PieceVocab } from './tokenizer.js';

/** The shapes of the model (as a llama2.c header gives them) and the seed of its weights. */
export interface GenerateParams extends Pick<LlamaConfig, 'dim' | 'hiddenDim' | 'nLayers' | 'nHeads' | 'nKvHeads' | 'vocabSize' | 'seqLen'> {
  seed: number;
  /** standard deviation of the weights; default 0.02 */
  std?: number;
}

/** xoshiro128** seeded through splitmix32: small, fast and fully deterministic. */
export class Rng {
  private s: Uint32Array;
  private spare: number | null = null;
  constructor(seed: number) {
    let x = seed >>> 0;
    const next = (): number => {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.s = Uint32Array.of(next(), next(), next(), next());
  }
  u32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1]!, 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1]! << 9) >>> 0;
    s[2]! ^= s[0]!;
    s[3]! ^= s[1]!;
    s[1]! ^= s[2]!;
    s[0]! ^= s[3]!;
    s[2]! ^= t;
    s[3] = rotl(s[3]!, 11);
    return result;
  }
  /** uniform in [0, 1) */
  float(): number {
    return this.u32() / 4294967296;
  }
  int(n: number): number {
    return Math.floor(this.float() * n);
  }
  /** standard normal (Box-Muller) */
  normal(): number {
    if (this.spare !== null) {
      const v = this.spare;
      this.spare = null;
      return v;
    }
    let u = 0;
    while (u === 0) u = this.float();
    const v = this.float();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

export function generateCheckpoint(p: GenerateParams): LlamaCheckpoint {
  const config: LlamaConfig = {
    dim: p.dim,
    hiddenDim: p.hiddenDim,
    nLayers: p.nLayers,
    nHeads: p.nHeads,
    nKvHeads: p.nKvHeads,
    vocabSize: p.vocabSize,
    seqLen: p.seqLen,
    sharedClassifier: true,
    normEps: 1e-5,
    ropeTheta: 10000,
  };
  validateConfig(config);
  const rng = new Rng(p.seed);
  const std = p.std ?? 0.02;
  const D = p.dim;
  const L = p.nLayers;
  const kd = kvDim(config);
  const normal = (n: number, s = std): Float32Array => {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = rng.normal() * s;
    return a;
  };
  const ones = (n: number): Float32Array => new Float32Array(n).fill(1);
  // residual-branch outputs scaled down with depth (GPT-2 style) so activations stay tame
  const outStd = std / Math.sqrt(2 * L);
  const tokenEmbedding = normal(p.vocabSize * D);
  const weights: LlamaWeights = {
    tokenEmbedding,
    rmsAtt: ones(L * D),
    wq: normal(L * D * D),
    wk: normal(L * kd * D),
    wv: normal(L * kd * D),
    wo: normal(L * D * D, outStd),
    rmsFfn: ones(L * D),
    w1: normal(L * p.hiddenDim * D),
    w2: normal(L * D * p.hiddenDim, outStd),
    w3: normal(L * p.hiddenDim * D),
    rmsFinal: ones(D),
    wcls: tokenEmbedding,
  };
  return { config, weights };
}

// A short original text the built-in vocabulary learns its merges from.
const CORPUS = `Once upon a time, there was a little fox named Pip. Pip lived in a green forest
near a big river. Every day, Pip liked to run and jump and play with his friends. One day, Pip
saw a shiny stone by the water. "What is this?" he asked. His friend, a wise old owl, said, "It is
a magic stone. If you are kind, it will help you." Pip was happy. He took the stone home and put it
under his bed. The next morning, the sun was bright and the birds were singing. Pip went to the
river to help a small duck who was stuck in the mud. He pulled and pulled, and the duck was free.
"Thank you, Pip!" said the duck. "You are a good friend." Pip smiled. He felt warm inside. When he
came back home, the stone was glowing. Pip learned that being kind makes everyone happy. They all
played together in the park until the sky was dark, and then they went to sleep. The end.
The cat sat on the mat. The dog ran to the ball. She wanted to play with the toy, but her mom said
it was time for lunch. They ate apples and bread, and then they read a book about a brave girl who
loved to climb trees and look at the stars. Where is the water? What do you want? I want to go
outside. We can play a game. Can you help me? Yes, I can help you, said the boy with a big smile.
Question: What is two plus two? Answer: four. user: hello assistant: Hi! How can I help you today?`;

const BYTE_PIECES = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
const BASE_CHARS = [' ', ...Array.from({ length: 0x7e - 0x21 + 1 }, (_, i) => String.fromCharCode(0x21 + i))];

/**
 * A llama2.c-layout vocabulary: <unk>, <s>, </s>, 256 byte tokens (ids 3..258),
 * BPE merges learned on a built-in text (then, when the vocabulary is larger
 * than the text supports, deterministic synthetic merges), then the printable
 * ASCII characters and space. Scores follow SentencePiece (-rank).
 */
export function buildByteVocab(vocabSize: number, seed = 1): PieceVocab {
  const fixed = 3 + 256 + BASE_CHARS.length;
  if (vocabSize < fixed) throw new Error(`generated vocabulary needs at least ${fixed} tokens, asked for ${vocabSize}`);
  const nMerges = vocabSize - fixed;
  const known = new Set<string>(BASE_CHARS);
  const merged: string[] = [];

  // words with their leading space, SentencePiece-style (pieces never cross a word start)
  const text = ' ' + CORPUS.replace(/\s+/g, ' ').trim();
  const wordCounts = new Map<string, number>();
  for (const m of text.matchAll(/ ?[^ ]+/g)) wordCounts.set(m[0], (wordCounts.get(m[0]) ?? 0) + 1);
  const words = [...wordCounts.entries()].map(([w, c]) => ({ syms: Array.from(w).filter((ch) => known.has(ch)), c }));
  while (merged.length < nMerges) {
    const pairs = new Map<string, { a: string; b: string; c: number }>();
    for (const w of words) {
      for (let i = 0; i + 1 < w.syms.length; i++) {
        const a = w.syms[i]!;
        const b = w.syms[i + 1]!;
        const key = `${a}\u0000${b}`;
        const e = pairs.get(key);
        if (e) e.c += w.c;
        else pairs.set(key, { a, b, c: w.c });
      }
    }
    let best: { a: string; b: string; c: number } | null = null;
    for (const e of pairs.values()) {
      if (known.has(e.a + e.b)) continue;
      if (!best || e.c > best.c || (e.c === best.c && e.a + '\u0000' + e.b < best.a + '\u0000' + best.b)) best = e;
    }
    if (!best || best.c < 2) break;
    const piece = best.a + best.b;
    merged.push(piece);
    known.add(piece);
    for (const w of words) {
      const out: string[] = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === best.a && w.syms[i + 1] === best.b) {
          out.push(piece);
          i++;
        } else out.push(w.syms[i]!);
      }
      w.syms = out;
    }
  }
  // synthetic merges for larger vocabularies: join two existing pieces (never a space inside)
  const rng = new Rng(seed ^ 0x5eed);
  const pool = [...BASE_CHARS, ...merged];
  let guard = 0;
  while (merged.length < nMerges) {
    if (++guard > nMerges * 1000) throw new Error('buildByteVocab: could not synthesise enough merges');
    const a = pool[rng.int(pool.length)]!;
    const b = pool[rng.int(pool.length)]!;
    if (b.includes(' ')) continue;
    const piece = a + b;
    if (piece.length > 8 || known.has(piece) || piece === ' ') continue;
    merged.push(piece);
    known.add(piece);
    pool.push(piece);
  }

  const pieces = ['<unk>', '\n<s>\n', '\n</s>\n', ...BYTE_PIECES, ...merged, ...BASE_CHARS];
  const scores = new Float32Array(pieces.length);
  for (let i = 0; i < merged.length; i++) scores[259 + i] = -i;
  for (let i = 0; i < BASE_CHARS.length; i++) scores[259 + merged.length + i] = -(merged.length + i);
  return { pieces, scores };
}
