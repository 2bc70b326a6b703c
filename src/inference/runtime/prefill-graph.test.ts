import { describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { GraphBuilder } from '../convert/onnx-graph.js';
import { linear, MATMUL_NBITS_ACCURACY_LEVEL, type WeightFormat } from '../convert/onnx-linear.js';
import { dequantizeMatrix, quantizeMatrix } from '../convert/quantize.js';
import { mulberry32 } from './sampler.js';
import { prefillGraph } from './prefill-graph.js';

const K = 96;
const N = 40;
const M = 64; // a prompt's rows

function uniform(n: number, seed: number, scale: number): Float32Array {
  const r = mulberry32(seed);
  return Float32Array.from({ length: n }, () => scale * (2 * r() - 1));
}

const W = uniform(K * N, 1, 0.1);

/** One `linear` node in `format`, as the converter writes a model's matrices. */
function graph(format: WeightFormat): Uint8Array {
  const gb = new GraphBuilder();
  const x = gb.input('x', 'float32', ['m', K]);
  linear(gb, x, 'w', W, K, N, { format }, 'y');
  gb.output('y', 'float32', ['m', N]);
  return gb.encode({ graphName: 't', opset: 17, producer: 'test' }).model;
}

function levels(bytes: Uint8Array): number[] {
  const m = onnxProto.onnx.ModelProto.decode(bytes);
  return m.graph!.node!.filter((n) => n.opType === 'MatMulNBits').map((n) => Number(n.attribute!.find((a) => a.name === 'accuracy_level')!.i));
}

async function run(bytes: Uint8Array, a: Float32Array): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(bytes, { graphOptimizationLevel: 'all', intraOpNumThreads: 1 });
  try {
    return (await s.run({ x: new ort.Tensor('float32', a, [M, K]) })).y!.data as Float32Array;
  } finally {
    await s.release();
  }
}

/** Largest distance of `y` from A x the 4-bit weights (dequantized), computed in float64. */
function worstError(y: Float32Array, a: Float32Array): number {
  const w = dequantizeMatrix(quantizeMatrix(W, K, N, 4));
  let worst = 0;
  for (let m = 0; m < M; m++) {
    for (let n = 0; n < N; n++) {
      let want = 0;
      for (let k = 0; k < K; k++) want += a[m * K + k]! * w[k * N + n]!;
      worst = Math.max(worst, Math.abs(y[m * N + n]! - want));
    }
  }
  return worst;
}

describe('prefillGraph', () => {
  it('makes every 4-bit product multiply in float32: the same weights, without the int8 rounding of the activations', async () => {
    const q4 = graph('int4');
    expect(levels(q4)).toEqual([MATMUL_NBITS_ACCURACY_LEVEL]);
    const f = prefillGraph(q4)!;
    expect(levels(f)).toEqual([0]);
    const a = uniform(M * K, 3, 1);
    const quantized = worstError(await run(q4, a), a);
    const float = worstError(await run(f, a), a);
    // float32 sums of 96 products are exact to ~1e-6; int8 activations round each input by up to 1/254 of its row's range
    expect(float).toBeLessThan(1e-4);
    expect(quantized).toBeGreaterThan(10 * float);
  });

  it('leaves graphs without 4-bit products, or already in float32, alone', () => {
    expect(prefillGraph(graph('int8'))).toBeUndefined();
    expect(prefillGraph(graph('f32'))).toBeUndefined();
    expect(prefillGraph(prefillGraph(graph('int4'))!)).toBeUndefined();
  });
});
