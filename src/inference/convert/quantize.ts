// Block quantization of MatMul weights into onnxruntime's MatMulNBits layout
// (com.microsoft contrib op), with llama.cpp's Q8_0 / Q4_0 rounding so that
// our int8 / int4 weights hold the same values as llama.cpp's q8_0 / q4_0 on
// the same checkpoint (the peer comparison is then like for like).
//
// MatMulNBits computes Y = A x dequant(B) for B of logical shape [K, N]:
//   B           uint8 [N, n_blocks, blob]  blocks run along K (one output column's inputs),
//                                          n_blocks = ceil(K / block), blob = block * bits / 8;
//                                          element j of a block sits at bits j*bits.. of the blob,
//                                          lowest bits first (4 bits: even j low nibble, odd j high)
//   scales      float [N * n_blocks]
//   zero_points absent: 2^(bits-1), so w = (q - 2^(bits-1)) * scale  (symmetric, as Q8_0 / Q4_0)
// A block past K is padded with zeros (stories260K's ffn_down has K = 172).
// Blocks are QUANT_BLOCK_ELEMENTS long: Q4_0's 32 for int4, 64 for int8 (why: there).

export type QuantBits = 4 | 8;

/**
 * Elements per block, by width (the converter's `--quant-block` overrides it).
 * int4: 32, llama.cpp's Q4_0 block, so our int4 holds Q4_0's very values; 64
 * would be ~16 % faster a decode step but loses quality on small models
 * (stories260K: "Lily and Tom..." 0/40 greedy tokens equal to f32's instead of
 * 5/40, the largest evaluation probability change 0.154 instead of 0.046).
 * int8: 64, Q8_0's rounding over twice Q8_0's block. Our scales are float32
 * where ggml's are fp16, so blocks of 64 store 8.5 bits a weight, exactly
 * q8_0's; and onnxruntime's int8 kernel pays per block, so a decode step at
 * one stream takes 17-23 % less (m25 2.18 -> 1.80 ms, m110 7.08 -> 5.44 ms on
 * one thread), with stories260K's greedy tokens unchanged (40/40 on all three
 * prompts) (bench/README.md, "Block size").
 */
export const QUANT_BLOCK_ELEMENTS: Readonly<Record<QuantBits, number>> = { 4: 32, 8: 64 };

/** The block sizes MLAS's MatMulNBits kernels take. */
export const QUANT_BLOCK_SIZES = [16, 32, 64, 128, 256] as const;

export function isQuantBlock(block: number): boolean {
  return (QUANT_BLOCK_SIZES as readonly number[]).includes(block);
}

export interface QuantizedMatrix {
  K: number;
  N: number;
  bits: QuantBits;
  block: number;
  /** [N, n_blocks, block * bits / 8] */
  packed: Uint8Array;
  /** [N * n_blocks], each an fp16 value (llama.cpp keeps the block scale in fp16) widened to float32 */
  scales: Float32Array;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const fr = Math.fround;

/** float32 -> IEEE half bits, round to nearest even (what ggml's fp32->fp16 does for finite values). */
export function fp32ToFp16Bits(v: number): number {
  f32[0] = v;
  const x = u32[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let h = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && h & 1)) h++;
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && h & 1)) h++; // a carry into the exponent is still correct
  return sign | h;
}

/** IEEE half bits -> number (exact). */
export function fp16BitsToFp32(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** C roundf: half away from zero. */
const roundf = (x: number): number => (x < 0 ? -Math.round(-x) : Math.round(x));

/**
 * Quantize `w` ([K, N] row-major, the B input of a MatMul) to `bits`, blocks
 * of `block` along K. The rounding is ggml's quantize_row_q8_0_ref /
 * quantize_row_q4_0_ref in float32 arithmetic: Q8_0 d = amax / 127, q =
 * round(x / d); Q4_0 d = max / -8 (max: the element of largest magnitude, sign
 * kept), q = min(15, trunc(x / d + 8.5)) - 8.
 */
export function quantizeMatrix(w: Float32Array, K: number, N: number, bits: QuantBits, block = QUANT_BLOCK_ELEMENTS[bits]): QuantizedMatrix {
  if (w.length !== K * N) throw new Error(`quantizeMatrix: ${w.length} values, expected ${K}x${N}`);
  if (!isQuantBlock(block)) throw new Error(`quantizeMatrix: block ${block} must be one of ${QUANT_BLOCK_SIZES.join(', ')}`);
  const nBlocks = Math.ceil(K / block);
  const blob = (block * bits) / 8;
  const packed = new Uint8Array(N * nBlocks * blob);
  const scales = new Float32Array(N * nBlocks);
  const x = new Float32Array(block);
  for (let n = 0; n < N; n++) {
    for (let b = 0; b < nBlocks; b++) {
      let amax = 0;
      let max = 0;
      for (let j = 0; j < block; j++) {
        const k = b * block + j;
        const v = k < K ? w[k * N + n]! : 0;
        x[j] = v;
        if (amax < Math.abs(v)) {
          amax = Math.abs(v);
          max = v;
        }
      }
      const d = bits === 8 ? fr(amax / 127) : fr(max / -8);
      const id = d ? fr(1 / d) : 0;
      const si = n * nBlocks + b;
      scales[si] = fp16BitsToFp32(fp32ToFp16Bits(d));
      const o = si * blob;
      if (bits === 8) {
        for (let j = 0; j < block; j++) packed[o + j] = roundf(fr(x[j]! * id)) + 128;
      } else {
        for (let j = 0; j < block; j += 2) {
          const q0 = Math.min(15, Math.trunc(fr(fr(x[j]! * id) + 8.5)));
          const q1 = Math.min(15, Math.trunc(fr(fr(x[j + 1]! * id) + 8.5)));
          packed[o + (j >> 1)] = q0 | (q1 << 4);
        }
      }
    }
  }
  return { K, N, bits, block, packed, scales };
}

/** The float32 [K, N] matrix MatMulNBits computes with (for tests and error bounds). */
export function dequantizeMatrix(q: QuantizedMatrix): Float32Array {
  const { K, N, bits, block } = q;
  const nBlocks = Math.ceil(K / block);
  const blob = (block * bits) / 8;
  const zp = 1 << (bits - 1);
  const out = new Float32Array(K * N);
  for (let n = 0; n < N; n++) {
    for (let b = 0; b < nBlocks; b++) {
      const s = q.scales[n * nBlocks + b]!;
      const o = (n * nBlocks + b) * blob;
      for (let j = 0; j < block; j++) {
        const k = b * block + j;
        if (k >= K) break;
        const raw = bits === 8 ? q.packed[o + j]! : (q.packed[o + (j >> 1)]! >> ((j & 1) * 4)) & 0xf;
        out[k * N + n] = (raw - zp) * s;
      }
    }
  }
  return out;
}
