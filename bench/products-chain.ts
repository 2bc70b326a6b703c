import ort from 'onnxruntime-node';
import { GraphBuilder } from '../src/inference/convert/onnx-graph.js';
import { linear, MATMUL_NBITS_ACCURACY_LEVEL } from '../src/inference/convert/onnx-linear.js';
import { isQuantBlock, QUANT_BLOCK_SIZES } from '../src/inference/convert/quantize.js';
import { FLOAT32_ACCURACY_LEVEL } from '../src/inference/runtime/prefill-graph.js';
import { mulberry32 } from '../src/inference/runtime/sampler.js';
import { spinningSessionConfig } from '../src/inference/runtime/spin.js';
import { benchArgs, fmt, machine, median, wholeFlag, wholeListFlag } from './lib.js';

// A decode step's block-quantized products alone, one row, chained layer after layer as the
// converter writes a layer's (the fused q|k|v projection, the output projection, the fused
// gate|up, the down projection), every layer with weights of its own: what one stream's products
// cost when each token reads every weight once. matmul-nbits.ts times one matrix again and again,
// which stays in the CPU's caches; here a chain of more layers than the last-level cache holds
// reads its weights from memory at every run, as m110's one-stream decode does (bench/README.md,
// forty-fourth session). Fewer layers (--layers 4) fit the cache: the time a layer at each count
// says which bound a step is under.
// Usage: node dist/bench/products-chain.js [--dim 768] [--hidden 2048] [--layers 4,12]
//   [--threads 1,2] [--blocks 32,64,128] [--accuracy 4] [--rounds 4]
// (--accuracy: MatMulNBits' accuracy_level, a list: 4 multiplies int8 activations, the converter's;
// 0 multiplies in float32 and reads fewer bytes a weight, which a memory-bound guest may prefer)
// (m110's shape by default; m25's is --dim 512 --hidden 1376 --layers 8). Two threads run as the
// daemon's decode session does (spinning while a run lasts and 1 ms after, runtime/spin.ts).

const args = benchArgs();
const D = wholeFlag(args, 'dim', 768, 32);
const HIDDEN = wholeFlag(args, 'hidden', 2048, 32);
const LAYER_COUNTS = args.has('layers') ? wholeListFlag(args, 'layers', 4, 1) : [4, 12];
const THREADS = args.has('threads') ? wholeListFlag(args, 'threads', 1, 1) : [1, 2];
const BLOCKS = args.has('blocks') ? wholeListFlag(args, 'blocks', 32, 16) : [32, 64, 128];
const ROUNDS = wholeFlag(args, 'rounds', 4, 1);
const LEVELS = args.has('accuracy') ? wholeListFlag(args, 'accuracy', MATMUL_NBITS_ACCURACY_LEVEL, 0) : [MATMUL_NBITS_ACCURACY_LEVEL];
for (const l of LEVELS) if (l !== FLOAT32_ACCURACY_LEVEL && l !== MATMUL_NBITS_ACCURACY_LEVEL) throw new Error(`--accuracy: each ${FLOAT32_ACCURACY_LEVEL} (float32) or ${MATMUL_NBITS_ACCURACY_LEVEL} (int8 activations), got '${args.get('accuracy')}'`);
// Checked before any session is built: a block MatMulNBits does not take stopped the run after the others had loaded.
for (const b of BLOCKS) if (!isQuantBlock(b)) throw new Error(`--blocks: each one of ${QUANT_BLOCK_SIZES.join(', ')}, got '${args.get('blocks')}'`);
/** The chain's output rms must lie within this and its inverse: far from float32's denormals (below 1.2e-38) and its overflow. */
const DENORMAL_GUARD_RMS = 1e-6;
/** Runs timed a round per case: enough for a median at a few milliseconds a run. */
const RUNS_PER_ROUND = 150;
/** Untimed runs before a round: the first runs after another case's find its weights out of the caches. */
const WARM_RUNS = 10;

/**
 * Bytes MatMulNBits reads a weight at one row: 4 bits and a float32 scale a block, and in the
 * int8-activation layout a float32 block sum a block too (MLAS's prepacked B); the float32 one
 * packs the 4 bits alone and reads the scales from the graph's own tensor (as read from MLAS's
 * packing, not measured: the float32 rows' GB/s rest on it).
 */
const bytesPerWeight = (block: number, level: number) => 0.5 + (level === MATMUL_NBITS_ACCURACY_LEVEL ? 8 : 4) / block;

function chain(layers: number, block: number, accuracyLevel: number): { model: Uint8Array; weights: number } {
  const gb = new GraphBuilder();
  let x = gb.input('x', 'float32', [1, D]);
  let seed = 0;
  // Values of no use but their own bytes: each matrix differs, so none is shared with another.
  // Uniform in +-sqrt(3 / k), a variance of 1 / k, so that a product keeps its input's size and a
  // chain of them never reaches float32's denormal range, where x86 computes dozens of times
  // slower: the weights this bench used before the fifty-first session (0.02 sin(...)) shrank the
  // values ~1e5-fold a layer, and the "cliff" it read past 8 layers of m110's shape (7 of m25's)
  // was denormal activations, not the cache (bench/README.md, fifty-first session).
  const w = (k: number, n: number) => {
    const rand = mulberry32(++seed);
    const a = Math.sqrt(3 / k);
    return Float32Array.from({ length: k * n }, () => (2 * rand() - 1) * a);
  };
  // The next product's input: the first `n` of the previous one's outputs (its K) on axis 1, as the split does in the graph.
  const first = (t: string, n: number) => gb.op1('Slice', [t, gb.i64([0]), gb.i64([n]), gb.i64([1]) /* axes */]);
  const opts = { format: 'int4' as const, block, accuracyLevel };
  let weights = 0;
  const product = (inp: string, name: string, k: number, n: number) => {
    weights += k * n;
    return linear(gb, inp, name, w(k, n), k, n, opts);
  };
  for (let l = 0; l < layers; l++) {
    const qkv = product(x, `l${l}.qkv`, D, 3 * D);
    const o = product(first(qkv, D), `l${l}.o`, D, D);
    const gateUp = product(o, `l${l}.w13`, D, 2 * HIDDEN);
    x = product(first(gateUp, HIDDEN), `l${l}.w2`, HIDDEN, D);
  }
  gb.output(x, 'float32', [1, D]);
  return { model: gb.encode({ graphName: 'products', opset: 17, producer: 'bench' }).model, weights };
}

async function main() {
  console.log(`machine: ${machine()}\nint4 products of ${D} x ${HIDDEN} layers at one row; ms a run, the median of ${ROUNDS} alternated rounds`);
  const cases: Array<{ layers: number; threads: number; block: number; level: number; s: ort.InferenceSession; weights: number; ms: number[] }> = [];
  for (const layers of LAYER_COUNTS) {
    for (const block of BLOCKS) for (const level of LEVELS) {
      const { model, weights } = chain(layers, block, level);
      for (const threads of THREADS) {
        const s = await ort.InferenceSession.create(model, {
          graphOptimizationLevel: 'all',
          intraOpNumThreads: threads,
          interOpNumThreads: 1,
          ...(threads > 1 ? { extra: { session: spinningSessionConfig('decode') } } : {}),
        });
        cases.push({ layers, threads, block, level, s, weights, ms: [] });
      }
    }
  }
  const feeds = { x: new ort.Tensor('float32', Float32Array.from({ length: D }, (_, i) => Math.cos(i)), [1, D]) };
  for (let r = 0; r < ROUNDS; r++) {
    for (const c of cases) {
      for (let i = 0; i < WARM_RUNS; i++) await c.s.run(feeds);
      const ts: number[] = [];
      for (let i = 0; i < RUNS_PER_ROUND; i++) {
        const t = performance.now();
        await c.s.run(feeds);
        ts.push(performance.now() - t);
      }
      c.ms.push(median(ts));
    }
  }
  // The guard on what the weights above promise: a chain whose output had shrunk to float32's
  // denormal range (or grown past its range) would time the slow arithmetic, not the weights' read.
  for (const c of cases) {
    const out = (await c.s.run(feeds))[c.s.outputNames[0]!]!.data as Float32Array;
    let rms = 0;
    for (const v of out) rms += v * v;
    rms = Math.sqrt(rms / out.length);
    if (!(rms > DENORMAL_GUARD_RMS && rms < 1 / DENORMAL_GUARD_RMS)) throw new Error(`products-chain: the ${c.layers}-layer chain's output has an rms of ${rms}: its values left float32's normal range, so its times would not be the products'`);
  }
  console.log('| layers | block | accuracy_level | threads | MB read a run | ms a run | ms a layer | GB/s |');
  console.log('| --- | --- | --- | --- | --- | --- | --- | --- |');
  for (const c of cases) {
    const ms = median(c.ms);
    const mb = (c.weights * bytesPerWeight(c.block, c.level)) / 1e6;
    console.log(`| ${c.layers} | ${c.block} | ${c.level} | ${c.threads} | ${fmt(mb, 1)} | ${fmt(ms, 3)} | ${fmt(ms / c.layers, 3)} | ${fmt(mb / ms, 1)} |`);
    await c.s.release();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
