import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import { Tokenizer } from '@huggingface/tokenizers';
import { Template } from '@huggingface/jinja';
import { parseCheckpoint, parseTokenizerBin, serializeCheckpoint, headSize, kvDim, type LlamaCheckpoint } from './llama2c.js';
import { prepareGenerated, prepareLlama2c, DEFAULT_CREATED, EXTERNAL_DATA_THRESHOLD_BYTES, variantWeightBytes } from './convert.js';
import { buildByteVocab, generateCheckpoint, type GenerateParams } from './generate.js';
import { buildLlamaOnnx } from './onnx-writer.js';
import { buildHfTokenizer, type PieceVocab } from './tokenizer.js';
import { writeModelDir } from './model-config.js';
import { ensureDefaultModels, findStories260k, RANDOM_LLAMA_PARAMS } from './default-models.js';

import { argmax, RefTransformer, refEncode, refGreedy } from './reference.js';
import { KvSlots, slotStepDone, slotStepFeeds } from '../runtime/kv-slots.js';

type Feeds = Record<string, ort.Tensor>;
const i64 = (rows: number[][]): ort.Tensor =>
  new ort.Tensor('int64', BigInt64Array.from(rows.flat().map((v) => BigInt(v))), [rows.length, rows[0]!.length]);

function emptyPast(ck: LlamaCheckpoint, batch: number): Feeds {
  const f: Feeds = {};
  const hs = headSize(ck.config);
  for (let l = 0; l < ck.config.nLayers; l++) {
    for (const kv of ['key', 'value']) {
      f[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [batch, ck.config.nKvHeads, 0, hs]);
    }
  }
  return f;
}

function presentAsPast(ck: LlamaCheckpoint, r: ort.InferenceSession.OnnxValueMapType): Feeds {
  const f: Feeds = {};
  for (let l = 0; l < ck.config.nLayers; l++) {
    f[`past_key_values.${l}.key`] = r[`present.${l}.key`] as ort.Tensor;
    f[`past_key_values.${l}.value`] = r[`present.${l}.value`] as ort.Tensor;
  }
  return f;
}

async function session(model: Uint8Array): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(model, { intraOpNumThreads: 1, interOpNumThreads: 1 });
}

/** Greedy decode with the KV cache: prefill the prompt, then one token per step. */
async function onnxGreedy(sess: ort.InferenceSession, ck: LlamaCheckpoint, prompt: number[], steps: number): Promise<number[]> {
  const V = ck.config.vocabSize;
  let past = emptyPast(ck, 1);
  let input = prompt;
  let total = 0;
  const out: number[] = [];
  for (let i = 0; i < steps; i++) {
    const S = input.length;
    const r = await sess.run({
      ...past,
      input_ids: i64([input]),
      attention_mask: i64([new Array(total + S).fill(1)]),
      position_ids: i64([input.map((_, j) => total + j)]),
    });
    const logits = r.logits!.data as Float32Array;
    const next = argmax(logits, (S - 1) * V, V);
    out.push(next);
    past = presentAsPast(ck, r);
    total += S;
    input = [next];
  }
  return out;
}

function maxAbsDiff(a: ArrayLike<number>, aOff: number, b: ArrayLike<number>, bOff: number, n: number): number {
  let m = 0;
  for (let i = 0; i < n; i++) m = Math.max(m, Math.abs(a[aOff + i]! - b[bOff + i]!));
  return m;
}

async function checkAgainstReference(ck: LlamaCheckpoint, sess: ort.InferenceSession, tokens: number[], tol: number): Promise<void> {
  const V = ck.config.vocabSize;
  const ref = new RefTransformer(ck);
  const r = await sess.run({
    ...emptyPast(ck, 1),
    input_ids: i64([tokens]),
    attention_mask: i64([tokens.map(() => 1)]),
    position_ids: i64([tokens.map((_, j) => j)]),
  });
  const logits = r.logits!.data as Float32Array;
  expect(r.logits!.dims).toEqual([1, tokens.length, V]);
  for (let pos = 0; pos < tokens.length; pos++) {
    const want = ref.forward(tokens[pos]!, pos);
    expect(maxAbsDiff(logits, pos * V, want, 0, V)).toBeLessThan(tol);
  }
}

/** Left-padded batch vs each row alone, for the prefill and two cached decode steps. */
async function checkBatch(ck: LlamaCheckpoint, sess: ort.InferenceSession, prompts: number[][], tol: number): Promise<void> {
  const V = ck.config.vocabSize;
  const Bn = prompts.length;
  const maxLen = Math.max(...prompts.map((p) => p.length));
  const steps = 3;
  // each row alone: logits at every prompt position and at each decode step
  const solo: Float32Array[][] = [];
  const soloNext: number[][] = [];
  for (const p of prompts) {
    const rows: Float32Array[] = [];
    const nexts: number[] = [];
    let past = emptyPast(ck, 1);
    let input = p;
    let total = 0;
    for (let s = 0; s < steps; s++) {
      const r = await sess.run({
        ...past,
        input_ids: i64([input]),
        attention_mask: i64([new Array(total + input.length).fill(1)]),
        position_ids: i64([input.map((_, j) => total + j)]),
      });
      const lg = r.logits!.data as Float32Array;
      for (let j = 0; j < input.length; j++) rows.push(lg.slice(j * V, (j + 1) * V));
      const next = argmax(lg, (input.length - 1) * V, V);
      nexts.push(next);
      past = presentAsPast(ck, r);
      total += input.length;
      input = [next];
    }
    solo.push(rows);
    soloNext.push(nexts);
  }
  // batched, left padded with pad id 0 and mask 0
  const mask = prompts.map((p) => [...new Array(maxLen - p.length).fill(0), ...p.map(() => 1)]);
  const ids = prompts.map((p) => [...new Array(maxLen - p.length).fill(0), ...p]);
  const posIds = prompts.map((p) => [...new Array(maxLen - p.length).fill(1), ...p.map((_, j) => j)]);
  let past = emptyPast(ck, Bn);
  let r = await sess.run({ ...past, input_ids: i64(ids), attention_mask: i64(mask), position_ids: i64(posIds) });
  let lg = r.logits!.data as Float32Array;
  expect(r.logits!.dims).toEqual([Bn, maxLen, V]);
  for (let b = 0; b < Bn; b++) {
    const pad = maxLen - prompts[b]!.length;
    for (let j = 0; j < prompts[b]!.length; j++) {
      expect(maxAbsDiff(lg, (b * maxLen + pad + j) * V, solo[b]![j]!, 0, V)).toBeLessThan(tol);
    }
  }
  for (let s = 1; s < steps; s++) {
    past = presentAsPast(ck, r);
    const next = prompts.map((_, b) => soloNext[b]![s - 1]!);
    mask.forEach((m) => m.push(1));
    const pos = prompts.map((p) => [p.length + s - 1]);
    r = await sess.run({ ...past, input_ids: i64(next.map((n) => [n])), attention_mask: i64(mask), position_ids: i64(pos) });
    lg = r.logits!.data as Float32Array;
    for (let b = 0; b < Bn; b++) {
      const want = solo[b]![prompts[b]!.length + s - 1]!;
      expect(maxAbsDiff(lg, b * V, want, 0, V)).toBeLessThan(tol);
    }
  }
}

/** One-pass prefill vs token-by-token with past. */
/**
 * The branch graph (rows continuing one shared prefix, each with its own past
 * of a different length and a different number of new tokens, left-padded)
 * against each row run from scratch on the model graph: last-position logits
 * and the presents of the row's own positions.
 */
async function checkSharedPrefix(
  ck: LlamaCheckpoint,
  main: ort.InferenceSession,
  branch: ort.InferenceSession,
  prefix: number[],
  rows: Array<{ own: number[]; next: number[] }>,
  tol: number,
): Promise<void> {
  const { vocabSize: V, nKvHeads: KV, nLayers: L } = ck.config;
  const hs = headSize(ck.config);
  const Q = prefix.length;
  const run = (tokens: number[]) =>
    main.run({
      input_ids: new ort.Tensor('int64', BigInt64Array.from(tokens, BigInt), [1, tokens.length]),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(tokens.length).fill(1n), [1, tokens.length]),
      position_ids: new ort.Tensor('int64', BigInt64Array.from(tokens, (_, i) => BigInt(i)), [1, tokens.length]),
      ...emptyPast(ck, 1),
    });
  const solo = [];
  for (const r of rows) solo.push(await run([...prefix, ...r.own, ...r.next]));
  const pre = await run(prefix);
  const B = rows.length;
  const P = Math.max(...rows.map((r) => r.own.length));
  const S = Math.max(...rows.map((r) => r.next.length));
  const T = P + S;
  const ids = new BigInt64Array(B * S);
  const pos = new BigInt64Array(B * S);
  const mask = new BigInt64Array(B * T);
  const feeds: Feeds = {};
  rows.forEach((r, b) => {
    mask.fill(1n, b * T + P - r.own.length, b * T + P);
    r.next.forEach((t, i) => {
      const j = S - r.next.length + i;
      ids[b * S + j] = BigInt(t);
      pos[b * S + j] = BigInt(Q + r.own.length + i);
      mask[b * T + P + j] = 1n;
    });
  });
  feeds.input_ids = new ort.Tensor('int64', ids, [B, S]);
  feeds.position_ids = new ort.Tensor('int64', pos, [B, S]);
  feeds.attention_mask = new ort.Tensor('int64', mask, [B, T]);
  for (let l = 0; l < L; l++) {
    for (const w of ['key', 'value']) {
      feeds[`prefix_key_values.${l}.${w}`] = pre[`present.${l}.${w}`]!;
      const past = new Float32Array(B * KV * P * hs);
      rows.forEach((r, b) => {
        const full = solo[b]![`present.${l}.${w}`]!.data as Float32Array;
        const n = Q + r.own.length + r.next.length;
        for (let h = 0; h < KV; h++) past.set(full.subarray((h * n + Q) * hs, (h * n + Q + r.own.length) * hs), ((b * KV + h) * P + P - r.own.length) * hs);
      });
      feeds[`past_key_values.${l}.${w}`] = new ort.Tensor('float32', past, [B, KV, P, hs]);
    }
  }
  const out = await branch.run(feeds);
  expect(out.logits!.dims).toEqual([B, 1, V]);
  rows.forEach((r, b) => {
    const n = Q + r.own.length + r.next.length;
    const want = (solo[b]!.logits!.data as Float32Array).subarray((n - 1) * V, n * V);
    const got = (out.logits!.data as Float32Array).subarray(b * V, (b + 1) * V);
    for (let i = 0; i < V; i++) expect(Math.abs(got[i]! - want[i]!)).toBeLessThan(tol);
    for (let l = 0; l < L; l++) {
      const full = solo[b]![`present.${l}.key`]!.data as Float32Array;
      const mine = out[`present.${l}.key`]!.data as Float32Array;
      // the row's positions in the padded present: where its mask is 1, in order
      const at = Array.from({ length: T }, (_, j) => j).filter((j) => mask[b * T + j] === 1n);
      expect(at).toHaveLength(r.own.length + r.next.length);
      for (let h = 0; h < KV; h++) {
        at.forEach((j, i) => {
          for (let d = 0; d < hs; d++) expect(Math.abs(mine[((b * KV + h) * T + j) * hs + d]! - full[(h * n + Q + i) * hs + d]!)).toBeLessThan(tol);
        });
      }
    }
  });
}

async function checkIncremental(ck: LlamaCheckpoint, sess: ort.InferenceSession, tokens: number[], tol: number): Promise<void> {
  const V = ck.config.vocabSize;
  const full = await sess.run({
    ...emptyPast(ck, 1),
    input_ids: i64([tokens]),
    attention_mask: i64([tokens.map(() => 1)]),
    position_ids: i64([tokens.map((_, j) => j)]),
  });
  const fl = full.logits!.data as Float32Array;
  let past = emptyPast(ck, 1);
  for (let j = 0; j < tokens.length; j++) {
    const r = await sess.run({
      ...past,
      input_ids: i64([[tokens[j]!]]),
      attention_mask: i64([new Array(j + 1).fill(1)]),
      position_ids: i64([[j]]),
    });
    expect(maxAbsDiff(r.logits!.data as Float32Array, 0, fl, j * V, V)).toBeLessThan(tol);
    past = presentAsPast(ck, r);
  }
  const pk = full['present.0.key'] as ort.Tensor;
  expect(pk.dims).toEqual([1, ck.config.nKvHeads, tokens.length, headSize(ck.config)]);
  expect(maxAbsDiff(pk.data as Float32Array, 0, (past['past_key_values.0.key']!.data as Float32Array), 0, pk.size)).toBeLessThan(1e-5);
}

const tokenizerFor = (v: PieceVocab, maxLen: number): Tokenizer => {
  const t = buildHfTokenizer(v, { modelMaxLength: maxLen });
  return new Tokenizer(t.tokenizerJson as object, t.tokenizerConfig as object);
};

const TEXTS = [
  'Once upon a time',
  'Once upon a time, there was a little girl named Lily.',
  'Hello world',
  '',
  ' leading space',
  'two  spaces and trailing ',
  'line one\nline two\n\ttabbed',
  'naïve café — “quotes” €5 ™',
  '日本語のテキスト',
  'emoji 🙂🚀 and ZWJ 👩‍💻',
  'math: x² + y² = z², ∑∞',
  '<b>tags</b> [brackets] {braces} ~tilde~ |pipe| \\ back',
  'Ünïcödé ÀÉÎÕÜ ñ ß ø å',
  'aaaaaaaaaaaaaaaa bbbbbbbbbb the the the',
];

// ---------------------------------------------------------------------------

const STORIES = findStories260k(process.env.SHARED_MODELS_DIR ?? path.resolve(fileURLToPath(new URL('.', import.meta.url)), '../../../../shared/models'));
const tmpDirs: string[] = [];
const tmp = (): string => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'cg-convert-'));
  tmpDirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of tmpDirs) fs.rmSync(d, { recursive: true, force: true });
});

describe.skipIf(!STORIES)('stories260K conversion (needs ../shared/models/stories260K)', () => {
  let ck: LlamaCheckpoint;
  let vocab: PieceVocab;
  let sess: ort.InferenceSession;
  let tok: Tokenizer;
  let tokConfig: Record<string, unknown>;
  let chatDir: string;

  beforeAll(async () => {
    const ckBytes = fs.readFileSync(path.join(STORIES!, 'stories260K.bin'));
    const tokBytes = fs.readFileSync(path.join(STORIES!, 'tok512.bin'));
    ck = parseCheckpoint(ckBytes);
    vocab = parseTokenizerBin(tokBytes, ck.config.vocabSize);
    const dir = tmp();
    // The past layout, as evaluation models are written (chat models keep a slot cache: tested below).
    writeModelDir(dir, prepareLlama2c(ckBytes, tokBytes, { id: 'test/stories260k', kind: 'evaluation', created: DEFAULT_CREATED }));
    sess = await ort.InferenceSession.create(path.join(dir, 'model.onnx'), { intraOpNumThreads: 1 });
    chatDir = tmp();
    writeModelDir(chatDir, prepareLlama2c(ckBytes, tokBytes, { id: 'test/stories260k', kind: 'chat', created: DEFAULT_CREATED }));
    tokConfig = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
    tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')), tokConfig);
  });

  it('reads the header', () => {
    expect(ck.config).toMatchObject({ dim: 64, hiddenDim: 172, nLayers: 5, nHeads: 8, nKvHeads: 4, vocabSize: 512, seqLen: 512, sharedClassifier: true });
  });

  it('has the optimum decoder signature', () => {
    expect(sess.inputNames.slice(0, 3)).toEqual(['input_ids', 'attention_mask', 'position_ids']);
    expect(sess.inputNames).toContain('past_key_values.4.value');
    expect(sess.outputNames.slice(0, 3)).toEqual(['logits', 'present.0.key', 'present.0.value']);
  });

  it('greedy decoding matches the llama2.c reference token for token (BOS alone and BOS + "Once upon a time")', async () => {
    const N = 48;
    for (const prompt of [[1], refEncode(vocab, 'Once upon a time', true, false)]) {
      const want = refGreedy(ck, prompt, N);
      const got = await onnxGreedy(sess, ck, prompt, N);
      expect(got).toEqual(want);
      const text = tok.decode([...prompt, ...got], { skip_special_tokens: true });
      expect(text.startsWith('Once upon a time, there was a little girl named Lily. She loved to play outside in the park.')).toBe(true);
    }
  });

  it("a chat folder's graph keeps a slot cache and decodes greedily like the reference", async () => {
    const chat = await ort.InferenceSession.create(path.join(chatDir, 'model.onnx'), { intraOpNumThreads: 1 });
    expect(chat.inputNames).toEqual(expect.arrayContaining(['input_ids', 'position_ids', 'cache_bias', 'new_bias', 'cache.4.value']));
    expect(chat.outputNames).toEqual(['logits', 'new_key_values']);
    const sl = new KvSlots({ layers: ck.config.nLayers, kvHeads: ck.config.nKvHeads, headDim: headSize(ck.config), positionsMax: ck.config.seqLen, emptyCacheFeeds: true });
    const prompt = refEncode(vocab, 'Once upon a time', true, false);
    const got: number[] = [];
    let input = prompt;
    for (let i = 0; i < 48; i++) {
      const st = slotStepFeeds(sl, [{ seq: 1, tokens: input }]);
      const logits = slotStepDone(sl, st, await chat.run(st.feeds));
      got.push(argmax(logits, 0, ck.config.vocabSize));
      input = [got.at(-1)!];
    }
    expect(got).toEqual(refGreedy(ck, prompt, 48));
  });

  it('logits match the reference forward pass', async () => {
    await checkAgainstReference(ck, sess, refEncode(vocab, 'Once upon a time, there was a cat.', true, false), 1e-3);
  });

  it('tokenizer.json encodes like llama2.c encode() and decodes back', () => {
    expect(tok.encode('Once upon a time').ids).toEqual(refEncode(vocab, 'Once upon a time', true, false));
    for (const text of TEXTS) {
      const want = refEncode(vocab, text, false, false);
      const got = tok.encode(text, { add_special_tokens: false }).ids;
      expect(got, JSON.stringify(text)).toEqual(want);
      if (got.length) expect(tok.decode(got)).toBe(text);
    }
    // byte fallback really happened for the non-ASCII text
    expect(tok.encode('日本', { add_special_tokens: false }).ids.some((id: number) => id >= 3 && id <= 258)).toBe(true);
  });

  it('chat template renders one BOS and encodes without extra special tokens', () => {
    const tpl = new Template(tokConfig.chat_template as string);
    const rendered = tpl.render({
      messages: [{ role: 'user', content: 'Tell me a story.' }],
      add_generation_prompt: true,
      bos_token: tokConfig.bos_token,
      eos_token: tokConfig.eos_token,
    });
    expect(rendered).toBe('<s>user: Tell me a story.\nassistant:');
    const ids = tok.encode(rendered, { add_special_tokens: false }).ids;
    expect(ids).toEqual(refEncode(vocab, 'user: Tell me a story.\nassistant:', true, false));
    expect(ids.filter((i: number) => i === 1)).toHaveLength(1);
  });

  it('left-padded batch of 3 matches each row alone (prefill and cached steps)', async () => {
    const prompts = ['Once upon a time, there was', 'The cat', 'Lily saw a big dog'].map((t) => refEncode(vocab, t, true, false));
    expect(new Set(prompts.map((p) => p.length)).size).toBe(3);
    await checkBatch(ck, sess, prompts, 1e-4);
  });

  it('prefill in one pass equals token-by-token with past', async () => {
    await checkIncremental(ck, sess, refEncode(vocab, 'One day, Lily went to the park', true, false), 1e-4);
  });
});

describe('seeded random-weight generator (always runs)', () => {
  const params: GenerateParams = { ...RANDOM_LLAMA_PARAMS, seqLen: 64 };

  it('same seed gives identical bytes, another seed differs', () => {
    const meta = { id: 'test/r', kind: 'chat' as const, created: DEFAULT_CREATED };
    const a = prepareGenerated(params, meta);
    const b = prepareGenerated(params, meta);
    const c = prepareGenerated({ ...params, seed: 2 }, meta);
    expect(Buffer.from(a.onnx[0]!.model).equals(Buffer.from(b.onnx[0]!.model))).toBe(true);
    expect(JSON.stringify(a.tokenizerJson)).toBe(JSON.stringify(b.tokenizerJson));
    expect(Buffer.from(a.onnx[0]!.model).equals(Buffer.from(c.onnx[0]!.model))).toBe(false);
  });

  it('checkpoint round-trips through the llama2.c layout', () => {
    const ck = generateCheckpoint(params);
    const back = parseCheckpoint(serializeCheckpoint(ck));
    expect(back.config).toEqual(ck.config);
    expect(Buffer.from(back.weights.w2.buffer, back.weights.w2.byteOffset, back.weights.w2.byteLength).equals(Buffer.from(ck.weights.w2.buffer))).toBe(true);
  });

  // larger weights than the shipped model so that mistakes show in the logits
  for (const [heads, kvHeads, rope] of [
    [8, 4, 'folded'],
    [8, 4, 'matmul'],
    [8, 4, 'kernel'],
    [4, 1, 'folded'],
    [4, 1, 'matmul'],
    [4, 1, 'kernel'],
    [4, 4, 'folded'],
    [4, 4, 'matmul'],
    [4, 4, 'kernel'],
  ] as const) {
    it(`ONNX graph matches the reference forward, batch and cache (${heads} heads, ${kvHeads} kv heads, rope ${rope})`, async () => {
      const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: heads, nKvHeads: kvHeads, vocabSize: 64, seqLen: 32, seed: 7, std: 0.3 });
      const sess = await session(buildLlamaOnnx(ck, { rope }).model);
      await checkAgainstReference(ck, sess, [1, 5, 9, 33, 2, 60, 17, 4], 1e-4);
      await checkBatch(ck, sess, [[1, 3, 4, 5, 6, 7], [1, 9], [1, 10, 11, 12]], 1e-4);
      await checkIncremental(ck, sess, [1, 40, 41, 42, 43], 1e-4);
    });
  }

  for (const [heads, kvHeads] of [
    [8, 4],
    [4, 1],
    [4, 4],
  ] as const) {
    it(`the shared-prefix branch graph matches the model graph row by row (${heads} heads, ${kvHeads} kv heads)`, async () => {
      const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: heads, nKvHeads: kvHeads, vocabSize: 64, seqLen: 32, seed: 11, std: 0.3 });
      const main = await session(buildLlamaOnnx(ck).model);
      const branch = await session(buildLlamaOnnx(ck, { sharedPrefix: true }).model);
      const rows = [
        { own: [], next: [5, 6, 7, 8] },
        { own: [9, 10, 11], next: [12] },
        { own: [13], next: [14, 15] },
        { own: [], next: [16] },
      ];
      await checkSharedPrefix(ck, main, branch, [1, 20, 21, 22, 23, 24, 25], rows, 1e-4);
      await checkSharedPrefix(ck, main, branch, [1], rows.slice(0, 1), 1e-4);
    });
  }

  it('the branch graph packs its rows\' real tokens, more of them in a step than the model has positions', async () => {
    // 10 rows of 2-6 tokens (pads where a row is shorter than 6), 40 real tokens: more than
    // seqLen's 32, where onnxruntime's RotaryEmbedding would refuse one packed row of all of them.
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 32, seed: 12, std: 0.3 });
    const main = await session(buildLlamaOnnx(ck).model);
    const branch = await session(buildLlamaOnnx(ck, { sharedPrefix: true }).model);
    const rows = Array.from({ length: 10 }, (_, r) => ({ own: r % 3 === 0 ? [40 + r] : [], next: Array.from({ length: 2 + (r % 5) }, (_, i) => 10 + r + i) }));
    expect(rows.reduce((n, r) => n + r.next.length, 0)).toBeGreaterThan(ck.config.seqLen);
    await checkSharedPrefix(ck, main, branch, [1, 20, 21], rows, 1e-4);
  });

  it('runs with graph optimizations disabled and with external weight data', async () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 8, nKvHeads: 2, vocabSize: 64, seqLen: 32, seed: 9, std: 0.3 });
    const plain = await ort.InferenceSession.create(buildLlamaOnnx(ck).model, { graphOptimizationLevel: 'disabled' });
    await checkAgainstReference(ck, plain, [1, 7, 8, 9, 10], 1e-4);
    const dir = tmp();
    const ext = buildLlamaOnnx(ck, { externalDataFile: 'model.onnx.data' });
    expect(ext.data!.byteLength).toBeGreaterThan(ext.model.byteLength);
    fs.writeFileSync(path.join(dir, 'model.onnx'), ext.model);
    fs.writeFileSync(path.join(dir, 'model.onnx.data'), ext.data!);
    const sess = await ort.InferenceSession.create(path.join(dir, 'model.onnx'));
    await checkAgainstReference(ck, sess, [1, 7, 8, 9, 10], 1e-4);
  });

  it("sends a variant's weights to a side file by its own width, not by float32's", () => {
    const ck = generateCheckpoint({ dim: 128, hiddenDim: 344, nLayers: 2, nHeads: 4, nKvHeads: 4, vocabSize: 512, seqLen: 16, seed: 3, std: 0.02 });
    // The estimate is what the graph's weights take, a little over (the graph's own bytes are small beside them).
    for (const weights of ['f32', 'f16', 'int8', 'int4'] as const) {
      const bytes = buildLlamaOnnx(ck, { weights, kvLayout: 'slots' }).model.byteLength;
      const est = variantWeightBytes(ck, weights);
      expect(est / bytes, weights).toBeGreaterThan(0.9);
      expect(est / bytes, weights).toBeLessThan(1.1);
    }
    // m450's shape (453.8 M parameters): 1.8 GB in float32 goes beside the graph; 0.29 GB at int4 and 0.55 at int8 stay in it.
    const n = (k: number) => ({ length: k });
    const [D, H, L, V] = [1536, 4096, 16, 512];
    const m450 = { weights: { tokenEmbedding: n(V * D), wq: n(L * D * D), wk: n(L * D * D), wv: n(L * D * D), wo: n(L * D * D), w1: n(L * D * H), w2: n(L * H * D), w3: n(L * D * H) } } as unknown as LlamaCheckpoint;
    expect(variantWeightBytes(m450, 'f32')).toBeGreaterThan(EXTERNAL_DATA_THRESHOLD_BYTES);
    expect(variantWeightBytes(m450, 'f16')).toBeLessThan(EXTERNAL_DATA_THRESHOLD_BYTES);
    expect(variantWeightBytes(m450, 'int8') / 1e9).toBeCloseTo(0.51, 1);
    expect(variantWeightBytes(m450, 'int4') / 1e9).toBeCloseTo(0.29, 1);
  });

  it('the built-in vocabulary loads in @huggingface/tokenizers and encodes like llama2.c', () => {
    for (const size of [512, 2048]) {
      const v = buildByteVocab(size, 1);
      expect(v.pieces).toHaveLength(size);
      const tok = tokenizerFor(v, 512);
      for (const text of TEXTS) {
        const got = tok.encode(text, { add_special_tokens: false }).ids;
        expect(got, JSON.stringify(text)).toEqual(refEncode(v, text, false, false));
        if (got.length) expect(tok.decode(got)).toBe(text);
      }
      expect(tok.encode('hi').ids[0]).toBe(1);
    }
  });

  it('default models: random ones always, stories260k when present, idempotent', () => {
    const dir = tmp();
    const t0 = Date.now();
    const first = ensureDefaultModels({ modelsDir: dir, sharedModelsDir: path.join(dir, 'no-shared') });
    expect(first.map((r) => [r.folder, r.action])).toEqual([
      ['random-llama', 'written'],
      ['random-llama-eval', 'written'],
    ]);
    const cg = JSON.parse(fs.readFileSync(path.join(dir, 'random-llama-eval', 'cloudgate.json'), 'utf8'));
    expect(cg).toMatchObject({ id: 'cloudgate/random-llama-eval', kind: 'evaluation', contextLength: 512 });
    const before = fs.statSync(path.join(dir, 'random-llama', 'model.onnx')).mtimeMs;
    const second = ensureDefaultModels({ modelsDir: dir, sharedModelsDir: STORIES ?? path.join(dir, 'no-shared') });
    expect(second.filter((r) => r.folder.startsWith('random')).every((r) => r.action === 'up-to-date')).toBe(true);
    expect(fs.statSync(path.join(dir, 'random-llama', 'model.onnx')).mtimeMs).toBe(before);
    // an evaluation model is whole only with its branch graph
    expect(fs.existsSync(path.join(dir, 'random-llama', 'branch.onnx'))).toBe(false);
    fs.rmSync(path.join(dir, 'random-llama-eval', 'branch.onnx'));
    const third = ensureDefaultModels({ modelsDir: dir, sharedModelsDir: path.join(dir, 'no-shared') });
    expect(third.map((r) => [r.folder, r.action])).toEqual([
      ['random-llama', 'up-to-date'],
      ['random-llama-eval', 'written'],
    ]);
    expect(fs.existsSync(path.join(dir, 'random-llama-eval', 'branch.onnx'))).toBe(true);
    if (STORIES) {
      expect(second.map((r) => r.folder)).toEqual(['random-llama', 'random-llama-eval', 'stories260k', 'stories260k-eval']);
      expect(JSON.parse(fs.readFileSync(path.join(dir, 'stories260k', 'cloudgate.json'), 'utf8')).id).toBe('cloudgate/stories260k');
    }
    expect(Date.now() - t0).toBeLessThan(5000);
  });
});
