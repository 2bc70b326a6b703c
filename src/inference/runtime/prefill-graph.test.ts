import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { GraphBuilder } from '../convert/onnx-graph.js';
import { linear, MATMUL_NBITS_ACCURACY_LEVEL, type WeightFormat } from '../convert/onnx-linear.js';
import { fp16BitsToFp32, QUANT_BLOCK_ELEMENTS, quantizeMatrix } from '../convert/quantize.js';
import { mulberry32 } from './sampler.js';
import { KvSlots, slotStepDone, slotStepFeeds } from './kv-slots.js';
import { generateCheckpoint } from '../convert/generate.js';
import { buildLlamaOnnx } from '../convert/onnx-writer.js';
import { headSize } from '../convert/llama2c.js';
import { prefillGraph } from './prefill-graph.js';
import { withRewrittenGraphConfig } from './external-data.js';
import { weightsBeside } from '../../../test/weights-beside.js';
import { extremeProductIsExact, weightTypeHere, type WeightType } from './integer-products.js';

const K = 96; // three blocks of 32: an odd count, so 4-bit zero points pad each column to a byte
const N = 40;
const M = 64; // a prompt's rows

function uniform(n: number, seed: number, scale: number): Float32Array {
  const r = mulberry32(seed);
  return Float32Array.from({ length: n }, () => scale * (2 * r() - 1));
}

const W = uniform(K * N, 1, 0.1);
const A = uniform(M * K, 3, 1);

function encode(gb: GraphBuilder, outputs: string[]): Uint8Array {
  gb.output(outputs[0]!, 'float32', ['m', N]);
  for (const o of outputs.slice(1)) gb.output(o, 'float32', ['m', N]);
  return gb.encode({ graphName: 't', opset: 17, producer: 'test' }).model;
}

/** One `linear` node in `format`, as the converter writes a model's matrices. */
function graph(format: WeightFormat, accuracyLevel?: number): Uint8Array {
  const gb = new GraphBuilder();
  linear(gb, gb.input('x', 'float32', ['m', K]), 'w', W, K, N, { format, accuracyLevel }, 'y');
  return encode(gb, ['y']);
}

/** The product in float32 of the node's own (dequantized) weights: what the int8 products approximate. */
function exact(format: 'int4' | 'int8'): Uint8Array {
  const bits = format === 'int4' ? 4 : 8;
  const q = quantizeMatrix(W, K, N, bits, QUANT_BLOCK_ELEMENTS[bits]);
  const block = q.block;
  const blocks = Math.ceil(K / block);
  const w = new Float32Array(K * N);
  for (let n = 0; n < N; n++)
    for (let k = 0; k < K; k++) {
      const b = Math.floor(k / block);
      const j = k % block;
      const at = (n * blocks + b) * ((block * bits) / 8);
      const v = bits === 8 ? q.packed[at + j]! - 128 : ((q.packed[at + (j >> 1)]! >> (4 * (j & 1))) & 0xf) - 8;
      w[k * N + n] = v * q.scales[n * blocks + b]!;
    }
  const gb = new GraphBuilder();
  linear(gb, gb.input('x', 'float32', ['m', K]), 'w', w, K, N, { format: 'f32' }, 'y');
  return encode(gb, ['y']);
}

/**
 * A 4-bit MatMulNBits written by hand: with zero points of `zeroType` (uint8: packed two a byte,
 * as onnxruntime's quantizer writes them; float: one a block), `products` nodes reading the
 * same weights (a tied matrix), and with `indirect` weights that are no initializer of their own.
 */
function handWritten(zeroType: 'uint8' | 'float32' | 'none', products = 1, indirect = false): Uint8Array {
  const q = quantizeMatrix(W, K, N, 4, 32);
  const blocks = K / 32;
  const gb = new GraphBuilder();
  const x = gb.input('x', 'float32', ['m', K]);
  gb.init('w.q', [N, blocks, 16], q.packed, 'uint8');
  gb.init('w.s', [N * blocks], q.scales);
  const inputs = [x, indirect ? gb.op1('Identity', ['w.q']) : 'w.q', 'w.s'];
  if (zeroType === 'uint8') {
    const perColumn = Math.ceil(blocks / 2);
    const z = new Uint8Array(N * perColumn);
    for (let n = 0; n < N; n++) for (let b = 0; b < blocks; b++) z[n * perColumn + (b >> 1)]! |= (6 + ((n + b) % 5)) << (4 * (b & 1));
    inputs.push(gb.init('w.z', [N * perColumn], z, 'uint8'));
  } else if (zeroType === 'float32') {
    inputs.push(gb.init('w.z', [N * blocks], Float32Array.from({ length: N * blocks }, (_, i) => 7 + (i % 3))));
  }
  const outs = Array.from({ length: products }, (_, i) => `y${i}`);
  for (const o of outs) gb.msOp1('MatMulNBits', inputs, { K, N, bits: 4, block_size: 32, accuracy_level: MATMUL_NBITS_ACCURACY_LEVEL }, o);
  return encode(gb, outs);
}

const nodes = (bytes: Uint8Array, op = 'MatMulNBits') => onnxProto.onnx.ModelProto.decode(bytes).graph!.node!.filter((n) => n.opType === op);
const attrOf = (n: onnxProto.onnx.INodeProto, name: string) => Number(n.attribute!.find((a) => a.name === name)?.i ?? -1);

async function run(bytes: Uint8Array, output = 'y', rows = M): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(bytes, { graphOptimizationLevel: 'all', intraOpNumThreads: 1 });
  try {
    return (await s.run({ x: new ort.Tensor('float32', A.subarray(0, rows * K), [rows, K]) }))[output]!.data as Float32Array;
  } finally {
    await s.release();
  }
}

const worstDiff = (a: Float32Array, b: Float32Array) => a.reduce((w, x, i) => Math.max(w, Math.abs(x - b[i]!)), 0);
const largest = (a: Float32Array) => a.reduce((m, x) => Math.max(m, Math.abs(x)), 0);

describe('prefillGraph', () => {
  // This CPU's weight type (integer-products.ts), as the worker takes it.
  let weightType: WeightType = 'int8';
  beforeAll(async () => {
    weightType = await weightTypeHere();
  });
  const rewrite = (bytes: Uint8Array) => prefillGraph(bytes, weightType);

  /** A product whose every weight is its column's largest and whose rows are all +1 or all -1: every pair of byte products at its largest. */
  const extreme = () => {
    const gb = new GraphBuilder();
    linear(gb, gb.input('x', 'float32', ['m', K]), 'w', new Float32Array(K * N).fill(0.1), K, N, { format: 'int8' }, 'y');
    const x = Float32Array.from({ length: 2 * K }, (_, i) => (i < K ? 1 : -1));
    return { bytes: encode(gb, ['y']), x };
  };
  const runRows = async (bytes: Uint8Array, x: Float32Array) => {
    const s = await ort.InferenceSession.create(bytes, { intraOpNumThreads: 1 });
    try {
      return (await s.run({ x: new ort.Tensor('float32', x, [x.length / K, K]) })).y!.data as Float32Array;
    } finally {
      await s.release();
    }
  };

  it("sums the largest activations and weights exactly with this CPU's weight type; int8 weights exactly only where the probe says so", async () => {
    const { bytes, x } = extreme();
    const y = await runRows(bytes, x);
    const bound = 1e-3 * largest(y);
    const off = async (type: WeightType) => worstDiff(await runRows(prefillGraph(bytes, type)!, x), y);
    expect(await off(weightType)).toBeLessThan(bound);
    // uint8 weights are exact on every CPU: the fallback's premise.
    expect(await off('uint8')).toBeLessThan(bound);
    expect(await extremeProductIsExact('uint8')).toBe(true);
    // int8 weights where u8 x s8 saturates its pairs (x86 without VNNI): off by far more than the bound.
    expect((await off('int8')) < bound).toBe(weightType === 'int8');
  });

  it('rewrites 4- and 8-bit products as int8 ones whose answers are as near the exact product as the converted graph\'s', async () => {
    for (const format of ['int4', 'int8'] as const) {
      const g = graph(format);
      const rewritten = rewrite(g)!;
      expect(nodes(rewritten)).toHaveLength(0);
      expect(nodes(rewritten, 'MatMulIntegerToFloat')).toHaveLength(1);
      const [y, yInt8, yExact] = [await run(g), await run(rewritten), await run(exact(format))];
      // MatMulNBits rounds the activations to int8 per block of 32, the rewrite per row and
      // the weights again per column: errors of one size, far below the answers' own.
      const own = worstDiff(y, yExact);
      expect(worstDiff(yInt8, yExact), format).toBeLessThan(3 * own + 1e-4);
      expect(worstDiff(yInt8, yExact), format).toBeLessThan(0.02 * largest(yExact));
      expect(worstDiff(yInt8, y), format).toBeGreaterThan(0); // not the converted graph run again
    }
  });

  it('stores the same weights as int8 or as uint8 around 128', () => {
    const DT = onnxProto.onnx.TensorProto.DataType;
    const weightsOf = (type: WeightType) => onnxProto.onnx.ModelProto.decode(prefillGraph(graph('int4'), type)!).graph!.initializer!.find((t) => t.name!.startsWith('cloudgate.int8.weights'))!;
    const [i8, u8] = [weightsOf('int8'), weightsOf('uint8')];
    expect([i8.dataType, u8.dataType]).toEqual([DT.INT8, DT.UINT8]);
    const signed = Array.from(new Int8Array(i8.rawData!.buffer, i8.rawData!.byteOffset, i8.rawData!.byteLength));
    expect(signed).toEqual(Array.from(u8.rawData!, (v) => v - 128));
    expect(Math.max(...signed.map(Math.abs))).toBe(127); // each column's largest at 127
    expect(new Set(signed).size).toBeGreaterThan(100);
  });

  it('rounds each row on its own: a row answers the same alone as among others', async () => {
    const rewritten = rewrite(graph('int4'))!;
    const [all, one] = [await run(rewritten), await run(rewritten, 'y', 1)];
    expect(Array.from(one)).toEqual(Array.from(all.subarray(0, N)));
  });

  it('applies uint8 zero points packed two a byte (a column of an odd block count padded) and float ones, and keeps one copy of a matrix two products read', async () => {
    const g = handWritten('uint8', 2);
    const rewritten = rewrite(g)!;
    const ns = nodes(rewritten, 'MatMulIntegerToFloat');
    expect(ns).toHaveLength(2);
    expect(ns[0]!.input![1]).toBe(ns[1]!.input![1]);
    const model = onnxProto.onnx.ModelProto.decode(rewritten).graph!;
    expect(model.initializer!.filter((t) => t.name!.startsWith('cloudgate.int8.weights'))).toHaveLength(1);
    expect(model.initializer!.map((t) => t.name)).not.toContain('w.q'); // the 4-bit copy no node reads is dropped
    const bound = (y: Float32Array) => 0.02 * largest(y);
    for (const o of ['y0', 'y1']) expect(worstDiff(await run(rewritten, o), await run(g, o))).toBeLessThan(bound(await run(g, o)));
    const f = handWritten('float32');
    expect(worstDiff(await run(rewrite(f)!, 'y0'), await run(f, 'y0'))).toBeLessThan(bound(await run(f, 'y0')));
    // zero points read wrong (none where there are some) move the answers far
    expect(worstDiff(await run(rewrite(handWritten('none'))!, 'y0'), await run(g, 'y0'))).toBeGreaterThan(10 * bound(await run(g, 'y0')));
  });

  it('multiplies in float32 a 4-bit product it cannot rewrite (weights that are no initializer)', async () => {
    const g = handWritten('uint8', 1, true);
    const f = rewrite(g)!;
    expect(nodes(f).map((n) => [attrOf(n, 'bits'), attrOf(n, 'accuracy_level')])).toEqual([[4, 0]]);
    expect(worstDiff(await run(f, 'y0'), await run(g, 'y0'))).toBeLessThan(0.05);
  });

  const q4f16 = path.resolve(process.env.SHARED_MODELS_DIR ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '../../../../shared/models'), 'tiny-random-llama-hf/model_q4f16.onnx');
  it.skipIf(!fs.existsSync(q4f16))('rewrites a third-party q4f16 export (float16 activations and scales) between two casts, its logits near the export\'s', async () => {
    const bytes = fs.readFileSync(q4f16);
    const rewritten = rewrite(bytes)!;
    expect(nodes(rewritten)).toHaveLength(0);
    expect(nodes(rewritten, 'MatMulIntegerToFloat').length).toBe(nodes(bytes).length);
    const logits = async (b: Uint8Array) => {
      const s = await ort.InferenceSession.create(b);
      try {
        const S = 12;
        const ids = (f: (i: number) => number) => new ort.Tensor('int64', BigInt64Array.from({ length: S }, (_, i) => BigInt(f(i))), [1, S]);
        const feeds: Record<string, ort.Tensor> = { input_ids: ids((i) => 5 + 13 * i), attention_mask: ids(() => 1), position_ids: ids((i) => i) };
        for (const m of s.inputMetadata as ort.InferenceSession.TensorValueMetadata[]) {
          if (m.name.startsWith('past_key_values.')) feeds[m.name] = new ort.Tensor('float16', new Uint16Array(0), [1, Number(m.shape[1]), 0, Number(m.shape[3])]);
        }
        const out = (await s.run(feeds)).logits!;
        expect(out.type).toBe('float16');
        return Float32Array.from(out.data as Uint16Array, fp16BitsToFp32);
      } finally {
        await s.release();
      }
    };
    const [y, yInt8] = [await logits(bytes), await logits(rewritten)];
    // measured: 0.0042 against logits of at most 0.38 (a tiny random model)
    expect(worstDiff(yInt8, y)).toBeLessThan(0.03 * largest(y));
  });

  it('reads an operand whose last two axes a Transpose swaps, through an Unsqueeze, as FusedMatMul transB: the same answers, rows copied whole', async () => {
    const gb = new GraphBuilder();
    linear(gb, gb.input('x', 'float32', ['m', K]), 'w', W, K, N, { format: 'int4' }, 'y');
    const unsqueezed = (t: string, perm: number[]) => gb.op1('Unsqueeze', [gb.op1('Transpose', [t], { perm }), gb.i64([1])]);
    // the branch graph's own keys and values: [B, KV, T, hd] -> [KV, 1, B, hd, T] and [KV, 1, B, T, hd]
    gb.op1('MatMul', [gb.input('q', 'float32', [3, 2, 2, 6, 5]), unsqueezed(gb.input('k', 'float32', [2, 3, 4, 5]), [1, 0, 3, 2])], {}, 'scores');
    gb.op1('MatMul', [gb.input('p', 'float32', [3, 2, 2, 6, 4]), unsqueezed(gb.input('v', 'float32', [2, 3, 4, 5]), [1, 0, 2, 3])], {}, 'context');
    gb.output('y', 'float32', ['m', N]);
    gb.output('scores', 'float32', [3, 2, 2, 6, 4]);
    gb.output('context', 'float32', [3, 2, 2, 6, 5]);
    const g = gb.encode({ graphName: 't', opset: 17, producer: 'test' }).model;
    const rewritten = rewrite(g)!;
    const decoded = onnxProto.onnx.ModelProto.decode(rewritten).graph!.node!;
    const fused = decoded.filter((n) => n.opType === 'FusedMatMul');
    expect(fused.map((n) => [n.output![0], attrOf(n, 'transB')])).toEqual([['scores', 1]]); // the values' Transpose keeps its rows already
    expect(decoded.filter((n) => n.opType === 'Transpose').map((n) => n.attribute![0]!.ints!.map(Number))).toEqual([[1, 0, 2, 3], [1, 0, 2, 3]]);
    const feeds = (shape: number[], seed: number) => new ort.Tensor('float32', uniform(shape.reduce((a, b) => a * b), seed, 1), shape);
    const inputs = { x: new ort.Tensor('float32', A, [M, K]), q: feeds([3, 2, 2, 6, 5], 5), k: feeds([2, 3, 4, 5], 6), p: feeds([3, 2, 2, 6, 4], 7), v: feeds([2, 3, 4, 5], 8) };
    const outs = async (b: Uint8Array) => {
      const sess = await ort.InferenceSession.create(b, { graphOptimizationLevel: 'all', intraOpNumThreads: 1 });
      try {
        return await sess.run(inputs);
      } finally {
        await sess.release();
      }
    };
    const [before, after] = [await outs(g), await outs(rewritten)];
    for (const o of ['scores', 'context']) expect(worstDiff(after[o]!.data as Float32Array, before[o]!.data as Float32Array), o).toBeLessThan(1e-5);
  });

  it("gives a slot-cache graph's new keys and values a layer each (new.N.key|value), written where a step over the cache reads them", async () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 64, seed: 4, std: 0.3 });
    const prefill = rewrite(buildLlamaOnnx(ck, { kvLayout: 'slots', weights: 'int4' }).model)!;
    const g = onnxProto.onnx.ModelProto.decode(prefill).graph!;
    expect(g.output!.map((o) => o.name)).toEqual(['logits', 'new.0.key', 'new.0.value', 'new.1.key', 'new.1.value']);
    expect(g.node!.filter((n) => n.opType === 'Identity' || n.output!.includes('new_key_values'))).toEqual([]);
    // A prompt of 30 tokens in one step, and in steps of 20 and 10 over the cache the first wrote: the same last logits.
    const sess = await ort.InferenceSession.create(prefill, { intraOpNumThreads: 1 });
    const tokens = Array.from({ length: 30 }, (_, i) => 1 + ((i * 11) % 63));
    const lastLogits = async (chunks: number[][]) => {
      const sl = new KvSlots({ layers: 2, kvHeads: 2, headDim: headSize(ck.config), positionsMax: 64, emptyCacheFeeds: true });
      let logits = new Float32Array(0);
      for (const chunk of chunks) {
        const st = slotStepFeeds(sl, [{ seq: 1, tokens: chunk }]);
        logits = slotStepDone(sl, st, await sess.run(st.feeds));
      }
      return logits;
    };
    expect(worstDiff(await lastLogits([tokens.slice(0, 20), tokens.slice(20)]), await lastLogits([tokens]))).toBeLessThan(1e-4);
  });

  it('reads weights kept in a file beside the graph from its folder, and answers as with them inside', async () => {
    const inside = handWritten('uint8', 2);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cg-prefill-'));
    try {
      const file = path.join(dir, 'model.onnx');
      fs.writeFileSync(file, inside);
      // Scales and zero points beside it too.
      weightsBeside(file, path.join(dir, 'model.onnx.data'), 16);
      const beside = fs.readFileSync(file);
      expect(() => prefillGraph(beside, weightType)).toThrow(/beside the graph/);
      const rewritten = prefillGraph(beside, weightType, dir)!;
      expect(nodes(rewritten, 'MatMulIntegerToFloat')).toHaveLength(2);
      const runWith = async (bytes: Uint8Array, opts: ort.InferenceSession.SessionOptions) => {
        const s = await ort.InferenceSession.create(bytes, opts);
        try {
          const out = await s.run({ x: new ort.Tensor('float32', A, [M, K]) });
          return [out.y0!.data, out.y1!.data] as Float32Array[];
        } finally {
          await s.release();
        }
      };
      const want = await runWith(rewrite(inside)!, { intraOpNumThreads: 1 });
      const got = await runWith(rewritten, withRewrittenGraphConfig({ intraOpNumThreads: 1 }, file));
      expect(got).toEqual(want);
      // A file outside the model's folder is not read.
      const model = onnxProto.onnx.ModelProto.decode(beside);
      model.graph!.initializer!.find((t) => t.name === 'w.q')!.externalData![0]!.value = '../model.onnx.data';
      expect(() => prefillGraph(onnxProto.onnx.ModelProto.encode(model).finish(), weightType, dir)).toThrow(/outside the model's folder/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('leaves graphs without block-quantized products alone', () => {
    expect(rewrite(graph('f32'))).toBeUndefined();
    expect(rewrite(rewrite(graph('int4'))!)).toBeUndefined();
    expect(rewrite(graph('int4', 0))).toBeDefined(); // float32 compute: rewritten all the same
  });
});
