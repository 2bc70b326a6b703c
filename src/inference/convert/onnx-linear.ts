// The weight matrices of the converted decoder in each weight format: one
// place decides how `x @ W` is written to the graph.
import type { GraphBuilder } from './onnx-graph.js';
import { fp32ToFp16Bits, quantizeMatrix, QUANT_BLOCK_ELEMENTS, type QuantBits } from './quantize.js';

/**
 * The converter's `--weights`: f32 as trained; f16 halves the file (stored
 * half, widened to float32 once when the session loads, so it computes as f32:
 * onnxruntime's CPU MatMul has no fast fp16 path on x86); int8 and int4 are
 * MatMulNBits with llama.cpp's Q4_0 values and Q8_0's rounding over blocks
 * of 64 (see quantize.ts).
 */
export const WEIGHT_FORMATS = ['f32', 'f16', 'int8', 'int4'] as const;
export type WeightFormat = (typeof WEIGHT_FORMATS)[number];

const BITS: Partial<Record<WeightFormat, QuantBits>> = { int8: 8, int4: 4 };

/** Whether a format's matrices are block-quantized (MatMulNBits), so a block size applies to it. */
export const isQuantized = (format: WeightFormat): boolean => BITS[format] !== undefined;

/**
 * MatMulNBits `accuracy_level`: 4 quantizes the activations to int8 per
 * block and runs int8 dot products (AVX-512 VNNI / AVX-VNNI here), as
 * llama.cpp does for q8_0 / q4_0; 0 (fp32 compute) dequantizes the weights
 * into float32 tiles. bench/matmul-nbits.ts measured level 4 fastest on both
 * widths for decode-sized and prefill-sized batches (bench/README.md).
 */
export const MATMUL_NBITS_ACCURACY_LEVEL = 4;

export interface LinearOptions {
  format: WeightFormat;
  /** overrides MATMUL_NBITS_ACCURACY_LEVEL (benchmarks) */
  accuracyLevel?: number;
  /** overrides QUANT_BLOCK_ELEMENTS (the converter's --quant-block) */
  block?: number;
}

/** `x @ w` for w [K, N] row-major (float32 as converted), written in `opts.format`; returns the output name. */
export function linear(gb: GraphBuilder, x: string, name: string, w: Float32Array, K: number, N: number, opts: LinearOptions, output?: string): string {
  const bits = BITS[opts.format];
  if (bits) {
    const q = quantizeMatrix(w, K, N, bits, opts.block ?? QUANT_BLOCK_ELEMENTS[bits]);
    const nBlocks = Math.ceil(K / q.block);
    gb.init(`${name}.qweight`, [N, nBlocks, (q.block * bits) / 8], q.packed, 'uint8');
    gb.init(`${name}.scales`, [N * nBlocks], q.scales);
    const attrs = { K, N, bits, block_size: q.block, accuracy_level: opts.accuracyLevel ?? MATMUL_NBITS_ACCURACY_LEVEL };
    return gb.msOp1('MatMulNBits', [x, `${name}.qweight`, `${name}.scales`], attrs, output);
  }
  if (opts.format === 'f16') {
    const h = new Uint16Array(w.length);
    for (let i = 0; i < w.length; i++) h[i] = fp32ToFp16Bits(w[i]!);
    gb.init(`${name}.fp16`, [K, N], h, 'float16');
    // A Cast of an initializer is folded at session load: the MatMul reads a float32 copy.
    const wide = gb.op1('Cast', [`${name}.fp16`], { to: 1 /* FLOAT */ }, name);
    return gb.op1('MatMul', [x, wide], {}, output);
  }
  gb.init(name, [K, N], w);
  return gb.op1('MatMul', [x, name], {}, output);
}
