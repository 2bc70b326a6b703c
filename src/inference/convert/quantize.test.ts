import { describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import { GraphBuilder } from './onnx-graph.js';
import { linear, type WeightFormat } from './onnx-linear.js';
import { dequantizeMatrix, fp16BitsToFp32, fp32ToFp16Bits, quantizeMatrix, QUANT_BLOCK_ELEMENTS, QUANT_BLOCK_SIZES } from './quantize.js';
import { mulberry32 } from '../runtime/sampler.js';

function gaussian(n: number, seed: number, std: number): Float32Array {
  const r = mulberry32(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = std * Math.sqrt(-2 * Math.log(r() || 1e-12)) * Math.cos(2 * Math.PI * r());
  return out;
}

/** C = A [M, K] x B [K, N], in float64. */
function matmul(a: Float32Array, b: Float32Array, M: number, K: number, N: number): Float64Array {
  const c = new Float64Array(M * N);
  for (let m = 0; m < M; m++) for (let k = 0; k < K; k++) for (let n = 0; n < N; n++) c[m * N + n]! += a[m * K + k]! * b[k * N + n]!;
  return c;
}

const rms = (x: ArrayLike<number>): number => Math.sqrt(Array.from(x).reduce((s, v) => s + v * v, 0) / x.length);
function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** One `linear` node run by onnxruntime: A [M, K] x W [K, N] in `format`. */
async function runLinear(a: Float32Array, w: Float32Array, M: number, K: number, N: number, format: WeightFormat, accuracyLevel?: number, block?: number): Promise<Float32Array> {
  const gb = new GraphBuilder();
  const x = gb.input('x', 'float32', ['m', K]);
  linear(gb, x, 'w', w, K, N, { format, accuracyLevel, block }, 'y');
  gb.output('y', 'float32', ['m', N]);
  const { model } = gb.encode({ graphName: 't', opset: 17, producer: 'test' });
  const s = await ort.InferenceSession.create(model, { graphOptimizationLevel: 'all', intraOpNumThreads: 1 });
  const r = await s.run({ x: new ort.Tensor('float32', a, [M, K]) });
  await s.release();
  return (r.y as ort.Tensor).data as Float32Array;
}

describe('fp16 rounding of block scales', () => {
  it('rounds to nearest even and keeps subnormals, as ggml does', () => {
    expect(fp32ToFp16Bits(1)).toBe(0x3c00);
    expect(fp32ToFp16Bits(-2)).toBe(0xc000);
    expect(fp32ToFp16Bits(65504)).toBe(0x7bff);
    expect(fp32ToFp16Bits(1e6)).toBe(0x7c00);
    expect(fp32ToFp16Bits(2 ** -24)).toBe(0x0001);
    expect(fp32ToFp16Bits(1 + 2 ** -11)).toBe(0x3c00); // tie -> even
    expect(fp32ToFp16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02); // tie -> even (up)
    for (const v of [0.1, 1e-3, 3.14159, 6e-5, 1e-7]) expect(Math.abs(fp16BitsToFp32(fp32ToFp16Bits(v)) - v)).toBeLessThanOrEqual(Math.max(v * 2 ** -11, 2 ** -25));
  });
});

describe('block quantization (Q8_0 / Q4_0 values in the MatMulNBits layout)', () => {
  it('dequantizes within half a step (int8) or one step (int4) of every weight, K not a multiple of the block included', () => {
    const K = 172; // stories260K's ffn_down: the last block is padded
    const N = 24;
    const w = gaussian(K * N, 7, 0.05);
    for (const bits of [8, 4] as const) {
      const q = quantizeMatrix(w, K, N, bits);
      expect(q.block).toBe(QUANT_BLOCK_ELEMENTS[bits]);
      const d = dequantizeMatrix(q);
      const nb = Math.ceil(K / q.block);
      for (let n = 0; n < N; n++) {
        for (let k = 0; k < K; k++) {
          const s = q.scales[n * nb + Math.floor(k / q.block)]!;
          // half a step for rounding, plus the fp16 rounding of the scale times the largest level
          const bound = Math.abs(s) * (bits === 8 ? 0.5 + 128 * 2 ** -11 : 1 + 8 * 2 ** -11);
          expect(Math.abs(d[k * N + n]! - w[k * N + n]!)).toBeLessThanOrEqual(bound * 1.0001);
        }
      }
    }
  });

  it('int4 keeps Q4_0\'s block of 32; int8 takes blocks of 64; a block MLAS has no kernel for is refused', () => {
    expect(QUANT_BLOCK_ELEMENTS).toEqual({ 4: 32, 8: 64 });
    const w = gaussian(128 * 2, 3, 0.05);
    // Q8_0's rounding over 64: one scale amax / 127 for the 64 weights
    const q = quantizeMatrix(w, 128, 2, 8);
    let amax = 0;
    for (let k = 0; k < 64; k++) amax = Math.max(amax, Math.abs(w[k * 2]!));
    expect(q.scales[0]).toBeCloseTo(amax / 127, 5);
    expect(q.scales.length).toBe(4);
    expect(() => quantizeMatrix(w, 128, 2, 8, 48)).toThrow(/block 48 must be one of 16, 32, 64, 128, 256/);
  });

  it('matches ggml Q4_0 on a known block: d = max / -8, the largest-magnitude weight exact', () => {
    const block = Float32Array.from({ length: 32 }, (_, j) => (j - 10) / 10); // max magnitude 2.1 at j = 31
    const q = quantizeMatrix(block, 32, 1, 4);
    expect(q.scales[0]).toBeCloseTo(2.1 / -8, 3);
    expect(q.packed[15]! >> 4).toBe(0); // j = 31 -> level 0, i.e. -8 * d = 2.1
    expect(dequantizeMatrix(q)[31]).toBeCloseTo(fp16BitsToFp32(fp32ToFp16Bits(2.1 / -8)) * -8, 6);
  });
});

describe('MatMulNBits in onnxruntime', () => {
  const M = 5;
  const K = 96;
  const N = 40;
  const a = gaussian(M * K, 1, 1);
  const w = gaussian(K * N, 2, 0.05);
  const exact = matmul(a, w, M, K, N);
  const scale = rms(exact);

  // Rounding error uniform over a step d = amax/127 (int8) or amax/8 (int4), amax about 2.5 sigma for
  // 32 gaussian weights: rms error about 2.5/127/sqrt(12) = 0.6 % and 2.5/8/sqrt(12) = 9 % of the product's rms.
  for (const [format, bits, tol] of [
    ['int8', 8, 0.012],
    ['int4', 4, 0.13],
  ] as const) {
    it(`${format}: computes A x dequant(W) (our packing is the op's), rms error within ${tol} of the f32 product's`, async () => {
      const deq = matmul(a, dequantizeMatrix(quantizeMatrix(w, K, N, bits)), M, K, N);
      // fp32 compute: the op's output is the dequantized product up to float rounding
      const y0 = await runLinear(a, w, M, K, N, format, 0);
      expect(maxDiff(y0, deq) / scale).toBeLessThan(1e-5);
      // int8 compute (activations quantized per block too): a little further, still far below the weight error
      const y4 = await runLinear(a, w, M, K, N, format, 4);
      expect(maxDiff(y4, deq) / scale).toBeLessThan(0.03);
      const err = rms(Array.from(y4, (v, i) => v - exact[i]!)) / scale;
      expect(err).toBeLessThan(tol);
      expect(err).toBeGreaterThan(tol / 10); // it is really quantized
    });
  }

  it('every block size the converter offers (--quant-block) is the op\'s packing too, K = 96 padded where the block is longer', async () => {
    for (const block of QUANT_BLOCK_SIZES) {
      for (const [format, bits] of [['int8', 8], ['int4', 4]] as const) {
        const deq = matmul(a, dequantizeMatrix(quantizeMatrix(w, K, N, bits, block)), M, K, N);
        expect(maxDiff(await runLinear(a, w, M, K, N, format, 0, block), deq) / scale, `${format} block ${block}`).toBeLessThan(1e-5);
      }
    }
  });

  it('f16: the product of the fp16-rounded weights', async () => {
    const y = await runLinear(a, w, M, K, N, 'f16');
    expect(maxDiff(y, exact) / scale).toBeLessThan(2e-3);
    const f32 = await runLinear(a, w, M, K, N, 'f32');
    expect(maxDiff(f32, exact) / scale).toBeLessThan(1e-5);
  });
});
