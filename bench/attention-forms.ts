import ort from 'onnxruntime-node';
import { GraphBuilder } from '../src/inference/convert/onnx-graph.js';
import { causalChunksAttention, slotAttentionCore, softmaxNoDenormals } from '../src/inference/convert/onnx-attention.js';
import { benchArgs, fmt, machine, median, wholeFlag, wholeListFlag } from './lib.js';

// One layer's attention after RoPE, timed alone in onnxruntime, in the form the slot-cache graph
// writes it (onnx-attention.ts slotAttentionCore: the cache's scores and the new tokens'
// concatenated for one Softmax, the probabilities split again) against forms that might suit a
// long prompt's step better:
// - "kv concat": the cache's keys and values concatenated with the new ones first, one score
//   square, no split (a copy of keys and values instead of one of the scores);
// - "two softmax pieces": the softmax written out over the two score blocks (one shared max, the
//   floor, Exp, two sums), no concatenation at all; it needs a cache of at least one position
//   (onnxruntime answers a reduction over an empty axis with an empty tensor), so a first chunk
//   runs it with one hidden position;
// - "GroupQueryAttention": onnxruntime's fused CPU kernel (its past and present copied, as
//   the worker cannot hand it one buffer for both);
// - "causal chunks N": the new tokens' queries in N chunks, each scoring only the new keys up to
//   its end (the causal mask's upper triangle, half the square at an empty cache, not computed).
// Each form's answer is checked against the slot graph's form before it is timed. Rounds alternate
// the forms, so each round's figures share the machine's minute; the medians of the rounds are
// printed, with each form's time over the slot graph's form's. Each round starts one form further
// on, so that no form is always the one that runs after a pause.
// Usage: node dist/bench/attention-forms.js [--kv-heads 8] [--head-dim 64] [--threads 2] [--rounds 7] [--prompt 512,128] [--after N] [--decode-rows 16] [--decode-cache 96]
// (m25's attention by default: 8 heads of 64; m110's is --kv-heads 12). The shapes: each --prompt
// length's first chunk, the first one's chunk over a cache of --after positions (its own length by
// default: a long prompt's second chunk), and a decode step.

const args = benchArgs();
const KV = wholeFlag(args, 'kv-heads', 8, 1);
const HD = wholeFlag(args, 'head-dim', 64, 1);
const THREADS = wholeFlag(args, 'threads', 2, 1);
const ROUNDS = wholeFlag(args, 'rounds', 7, 1);
/** Time a form runs a shape for, each round: long enough for dozens of a long prompt's runs. */
const ROUND_MS = 300;
/** Runs of each form at a shape before its rounds: onnxruntime plans its memory at a shape's first runs. */
const WARM_RUNS = 3;
/** The largest difference from the slot graph's form that still counts as the same answer (float32 sums in another order). */
const SAME_ANSWER_MAX = 1e-5;
/** A masked score, as the worker's biases write it. */
const MASKED = -1e9;

type Form = 'slot graph' | 'kv concat' | 'two softmax pieces' | 'GroupQueryAttention' | `causal chunks ${number}`;
const FORMS: Form[] = ['slot graph', 'kv concat', 'two softmax pieces', 'GroupQueryAttention', 'causal chunks 2', 'causal chunks 4'];

/** The form's graph: inputs q, k, v [B, KV, S, hd], cacheK, cacheV [B, KV, C, hd], cacheBias [B, 1, 1, C], newBias [B, 1, S, S], probSplit [C, S]; output ctx [B, KV, S, hd]. */
function graphOf(form: Form): Uint8Array {
  const gb = new GraphBuilder();
  const q = gb.input('q', 'float32', ['B', KV, 'S', HD]);
  const k = gb.input('k', 'float32', ['B', KV, 'S', HD]);
  const v = gb.input('v', 'float32', ['B', KV, 'S', HD]);
  const cacheK = gb.input('cacheK', 'float32', ['B', KV, 'C', HD]);
  const cacheV = gb.input('cacheV', 'float32', ['B', KV, 'C', HD]);
  const cacheBias = gb.input('cacheBias', 'float32', ['B', 1, 1, 'C']);
  const newBias = gb.input('newBias', 'float32', ['B', 1, 'S', 'S']);
  const probSplit = gb.input('probSplit', 'int64', [2]);
  const kT = { perm: [0, 1, 3, 2] };
  const dim = (x: string, axis: number) => gb.op1('Slice', [gb.op1('Shape', [x]), gb.i64([axis]), gb.i64([axis + 1])]);
  const scoresOf = (qq: string, keys: string, bias: string) => gb.op1('Add', [gb.op1('MatMul', [qq, gb.op1('Transpose', [keys], kT)]), bias]);
  let ctx: string;
  if (form === 'slot graph') {
    ctx = slotAttentionCore(gb, { q, k, v, cacheK, cacheV }, { cacheBias, newBias, probSplit });
  } else if (form === 'kv concat') {
    const keys = gb.op1('Concat', [cacheK, k], { axis: 2 });
    const values = gb.op1('Concat', [cacheV, v], { axis: 2 });
    const wide = gb.op1('Concat', [gb.i64([1, 1]), dim(q, 2), dim(cacheK, 2)], { axis: 0 });
    const bias = gb.op1('Concat', [gb.op1('Expand', [cacheBias, wide]), newBias], { axis: -1 });
    ctx = gb.op1('MatMul', [softmaxNoDenormals(gb, scoresOf(q, keys, bias)), values]);
  } else if (form === 'two softmax pieces') {
    const cs = scoresOf(q, cacheK, cacheBias);
    const ns = scoresOf(q, k, newBias);
    const rowMax = (x: string) => gb.op1('ReduceMax', [x], { axes: [-1], keepdims: 1 });
    const m = gb.op1('Max', [rowMax(cs), rowMax(ns)]);
    const weights = (x: string) => gb.op1('Exp', [gb.op1('Max', [gb.op1('Sub', [x, m]), gb.f32(-60)])]);
    const [ec, en] = [weights(cs), weights(ns)];
    const sum = (x: string) => gb.op1('ReduceSum', [x, gb.i64([-1])], { keepdims: 1 });
    ctx = gb.op1('Div', [gb.op1('Add', [gb.op1('MatMul', [ec, cacheV]), gb.op1('MatMul', [en, v])]), gb.op1('Add', [sum(ec), sum(en)])]);
  } else if (form === 'GroupQueryAttention') {
    const bsh = (x: string) => gb.op1('Reshape', [gb.op1('Transpose', [x], { perm: [0, 2, 1, 3] }), gb.i64([0, 0, KV * HD])]);
    const total = gb.op1('Cast', [gb.op1('Add', [dim(q, 2), dim(cacheK, 2)])], { to: 6 /* INT32 */ });
    // seqlens_k: each row's length after the step, less one (every row here fills its cache).
    const seqlens = gb.op1('Expand', [gb.op1('Sub', [total, gb.op1('Cast', [gb.i64([1])], { to: 6 })]), dim(q, 0)]);
    const [out] = gb.op('GroupQueryAttention', [bsh(q), bsh(k), bsh(v), cacheK, cacheV, seqlens, gb.op1('Reshape', [total, gb.i64([])])], { num_heads: KV, kv_num_heads: KV, scale: { float: 1 } }, 3, undefined, 'com.microsoft');
    ctx = gb.op1('Transpose', [gb.op1('Reshape', [out!, gb.i64([0, 0, KV, HD])])], { perm: [0, 2, 1, 3] });
  } else {
    ctx = causalChunksAttention(gb, { q, k, v, cacheK, cacheV }, { cacheBias, newBias }, Number(form.split(' ')[2]));
  }
  gb.output(gb.op1('Identity', [ctx], {}, 'ctx'), 'float32', ['B', KV, 'S', HD]);
  return gb.encode({ graphName: form, opset: 17, producer: 'bench' }).model;
}

interface Shape {
  label: string;
  B: number;
  S: number;
  C: number;
}

/** Feeds of a shape: rows that start at position C (their cache full), causal among their own tokens. */
function feedsOf({ B, S, C }: Shape, seed: number): Record<string, ort.Tensor> {
  let x = seed;
  const noise = (n: number) => Float32Array.from({ length: n }, () => ((x = (x * 1103515245 + 12345) % 2 ** 31) / 2 ** 31 - 0.5) * 2);
  const newBias = new Float32Array(B * S * S);
  for (let b = 0; b < B; b++) for (let i = 0; i < S; i++) for (let j = i + 1; j < S; j++) newBias[(b * S + i) * S + j] = MASKED;
  const t = (data: Float32Array, dims: number[]) => new ort.Tensor('float32', data, dims);
  return {
    q: t(noise(B * KV * S * HD), [B, KV, S, HD]),
    k: t(noise(B * KV * S * HD), [B, KV, S, HD]),
    v: t(noise(B * KV * S * HD), [B, KV, S, HD]),
    cacheK: t(noise(B * KV * C * HD), [B, KV, C, HD]),
    cacheV: t(noise(B * KV * C * HD), [B, KV, C, HD]),
    cacheBias: t(new Float32Array(B * C), [B, 1, 1, C]),
    newBias: t(newBias, [B, 1, S, S]),
    probSplit: new ort.Tensor('int64', BigInt64Array.from([BigInt(C), BigInt(S)]), [2]),
  };
}

/** A first chunk's cache with one position, hidden: what the two-piece form needs in place of an empty one. */
function withOneHidden(feeds: Record<string, ort.Tensor>, { B, S }: Shape): Record<string, ort.Tensor> {
  return {
    ...feeds,
    cacheK: new ort.Tensor('float32', new Float32Array(B * KV * HD), [B, KV, 1, HD]),
    cacheV: new ort.Tensor('float32', new Float32Array(B * KV * HD), [B, KV, 1, HD]),
    cacheBias: new ort.Tensor('float32', new Float32Array(B).fill(MASKED), [B, 1, 1, 1]),
    probSplit: new ort.Tensor('int64', BigInt64Array.from([1n, BigInt(S)]), [2]),
  };
}

async function msPerRun(s: ort.InferenceSession, feeds: Record<string, ort.Tensor>): Promise<number> {
  await s.run(feeds);
  let n = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < ROUND_MS) {
    await s.run(feeds);
    n++;
  }
  return (performance.now() - t0) / n;
}

async function main() {
  const prompts = args.has('prompt') ? wholeListFlag(args, 'prompt', 512, 1) : [512, 128];
  const [rows, cache] = [wholeFlag(args, 'decode-rows', 16, 1), wholeFlag(args, 'decode-cache', 96, 1)];
  const after = wholeFlag(args, 'after', prompts[0]!, 1);
  const shapes: Shape[] = [
    ...prompts.map((S) => ({ label: `a ${S}-token prompt, empty cache`, B: 1, S, C: 0 })),
    { label: `a ${prompts[0]}-token chunk after ${after}`, B: 1, S: prompts[0]!, C: after },
    { label: `a decode step of ${rows} rows, cache ${cache}`, B: rows, S: 1, C: cache },
  ];
  console.log(`machine: ${machine()}\none layer's attention, ${KV} heads of ${HD}, ${THREADS} intra-op thread(s) sleeping between operators; ms per run, median of ${ROUNDS} alternated rounds (over the slot graph's form)`);
  const sessions = new Map<Form, ort.InferenceSession>();
  for (const form of FORMS) sessions.set(form, await ort.InferenceSession.create(graphOf(form), { graphOptimizationLevel: 'all', intraOpNumThreads: THREADS, interOpNumThreads: 1 }));
  console.log(`| shape | ${FORMS.join(' | ')} |\n| --- | ${FORMS.map(() => '---').join(' | ')} |`);
  for (const shape of shapes) {
    const base = feedsOf(shape, 7);
    const feedsFor = (form: Form) => (form === 'two softmax pieces' && shape.C === 0 ? withOneHidden(base, shape) : base);
    const want = (await sessions.get('slot graph')!.run(base)).ctx!.data as Float32Array;
    for (const form of FORMS) {
      const got = (await sessions.get(form)!.run(feedsFor(form))).ctx!.data as Float32Array;
      let diff = 0;
      for (let i = 0; i < got.length; i++) diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
      if (!(diff <= SAME_ANSWER_MAX)) throw new Error(`${form} at ${shape.label}: answers differ from the slot graph's by ${diff}`);
    }
    // Each form's first runs at a new shape are slow (onnxruntime plans its memory per shape), and
    // the first form of a round meets caches the one before it left: warm-up runs, then rounds that
    // each start one form further on.
    for (const form of FORMS) for (let i = 0; i < WARM_RUNS; i++) await sessions.get(form)!.run(feedsFor(form));
    const ms = new Map<Form, number[]>(FORMS.map((f) => [f, []]));
    for (let r = 0; r < ROUNDS; r++) {
      for (let i = 0; i < FORMS.length; i++) {
        const form = FORMS[(r + i) % FORMS.length]!;
        ms.get(form)!.push(await msPerRun(sessions.get(form)!, feedsFor(form)));
      }
    }
    const slot = median(ms.get('slot graph')!);
    const cell = (f: Form) => `${fmt(median(ms.get(f)!), 3)}${f === 'slot graph' ? '' : ` (${fmt(median(ms.get(f)!) / slot, 2)})`}`;
    console.log(`| ${shape.label} | ${FORMS.map(cell).join(' | ')} |`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
