import { describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { GraphBuilder } from '../convert/onnx-graph.js';
import { linear, MATMUL_NBITS_ACCURACY_LEVEL, type WeightFormat } from '../convert/onnx-linear.js';
import { quantizeMatrix } from '../convert/quantize.js';
import { mulberry32 } from './sampler.js';
import { prefillGraph } from './prefill-graph.js';

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

/**
 * A 4-bit MatMulNBits written by hand: with zero points of `zeroType` (uint8: packed two a byte,
 * as onnxruntime's quantizer writes them; float: one a block), and `products` nodes reading the
 * same weights (a tied matrix).
 */
function handWritten(zeroType: 'uint8' | 'float32' | 'none', products = 1): Uint8Array {
  const q = quantizeMatrix(W, K, N, 4, 32);
  const blocks = K / 32;
  const gb = new GraphBuilder();
  const x = gb.input('x', 'float32', ['m', K]);
  gb.init('w.q', [N, blocks, 16], q.packed, 'uint8');
  gb.init('w.s', [N * blocks], q.scales);
  const inputs = [x, 'w.q', 'w.s'];
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

const nodes = (bytes: Uint8Array) => onnxProto.onnx.ModelProto.decode(bytes).graph!.node!.filter((n) => n.opType === 'MatMulNBits');
const attrOf = (n: onnxProto.onnx.INodeProto, name: string) => Number(n.attribute!.find((a) => a.name === name)?.i ?? -1);

async function run(bytes: Uint8Array, output = 'y'): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(bytes, { graphOptimizationLevel: 'all', intraOpNumThreads: 1 });
  try {
    return (await s.run({ x: new ort.Tensor('float32', A, [M, K]) }))[output]!.data as Float32Array;
  } finally {
    await s.release();
  }
}

const worstDiff = (a: Float32Array, b: Float32Array) => a.reduce((w, x, i) => Math.max(w, Math.abs(x - b[i]!)), 0);

describe('prefillGraph', () => {
  it('widens every 4-bit product to 8 bits holding the same values: the answers are the converted graph’s up to the order of the sums', async () => {
    const q4 = graph('int4');
    const wide = prefillGraph(q4)!;
    expect(nodes(wide).map((n) => [attrOf(n, 'bits'), attrOf(n, 'accuracy_level')])).toEqual([[8, MATMUL_NBITS_ACCURACY_LEVEL]]);
    const [y4, y8, yFloat] = [await run(q4), await run(wide), await run(graph('int4', 0))];
    // Same weights, same int8 rounding of the activations: only the sums' order differs. Products in
    // float32 (the weights dequantized) differ by that rounding, two orders of magnitude more.
    expect(worstDiff(y8, y4)).toBeLessThan(1e-5);
    expect(worstDiff(yFloat, y4)).toBeGreaterThan(100 * worstDiff(y8, y4) + 1e-4);
  });

  it('widens uint8 zero points packed two a byte (a column of an odd block count padded), and one copy of a matrix two products read', async () => {
    const g = handWritten('uint8', 2);
    const wide = prefillGraph(g)!;
    const ns = nodes(wide);
    expect(ns.map((n) => attrOf(n, 'bits'))).toEqual([8, 8]);
    expect(ns[0]!.input).toEqual(ns[1]!.input);
    expect(ns[0]!.input![1]).toBe('w.q.wide8');
    const names = onnxProto.onnx.ModelProto.decode(wide).graph!.initializer!.map((t) => t.name);
    expect(names.filter((n) => n === 'w.q.wide8')).toHaveLength(1);
    for (const o of ['y0', 'y1']) expect(worstDiff(await run(wide, o), await run(g, o))).toBeLessThan(1e-5);
  });

  it('multiplies in float32 a 4-bit product it cannot widen (zero points in float)', async () => {
    const g = handWritten('float32');
    const f = prefillGraph(g)!;
    expect(nodes(f).map((n) => [attrOf(n, 'bits'), attrOf(n, 'accuracy_level')])).toEqual([[4, 0]]);
    expect(worstDiff(await run(f, 'y0'), await run(g, 'y0'))).toBeLessThan(0.05);
  });

  it('leaves graphs without 4-bit products alone', () => {
    expect(prefillGraph(graph('int8'))).toBeUndefined();
    expect(prefillGraph(graph('f32'))).toBeUndefined();
    expect(prefillGraph(prefillGraph(graph('int4'))!)).toBeUndefined();
    expect(prefillGraph(graph('int4', 0))).toBeDefined(); // already float32: widened all the same
  });
});
