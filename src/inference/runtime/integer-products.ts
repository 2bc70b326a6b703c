import ort from 'onnxruntime-node';
import { GraphBuilder, MS_DOMAIN } from '../convert/onnx-graph.js';

// How the prefill graph (prefill-graph.ts) stores its int8 weights on this CPU.
//
// onnxruntime's u8 x s8 product (MLAS QGEMM) on an x86 CPU without VNNI (AVX2 only, or
// AVX-512 before VNNI) multiplies with `vpmaddubsw`, which adds two neighbouring byte products
// into an int16 that saturates: 255 x 127 x 2 = 64,770 comes out as 32,767. The activations
// sit around 128 (their zero point), so a pair of large weights of one sign overflows, and
// stories260K's probabilities moved by up to 0.39 (bench/README.md "Saturated pairs"). With
// VNNI (`vpdpbusd`), AMX or on ARM the products add in int32 and nothing is lost.
//
// Where u8 x s8 saturates, the weights are stored as uint8 around a zero point of 128 instead:
// MLAS's u8 x u8 product widens both to int16 and adds pairs in int32 (`vpmaddwd`): exact, as
// fast as u8 x s8 on m25's matrices and 15-28 % slower on m110's at a short prompt's rows (same
// bench/README.md section), the price of right answers. Narrower operands that u8 x s8 sums
// exactly (7-bit weights or activations) rounded too coarsely. Where u8 x s8 is exact it stays:
// it is the one VNNI and AMX speed up.
//
// Which of the two holds is measured, not read from CPU flags: the kernel MLAS picks is what
// decides, and a product of the extreme values shows it.

/** How the prefill graph's weights are stored: int8, or uint8 offset by ZERO_POINT_UINT8. */
export type WeightType = 'int8' | 'uint8';
/** The uint8 weights' zero point: int8 values offset into uint8 (and the activations' zero point too). */
export const ZERO_POINT_UINT8 = 128;
/** The largest int8 magnitude either side is rounded to. */
export const INT8_MAX = 127;
/** The largest uint8 value: the activation the probe multiplies, a real row's largest. */
const UINT8_MAX = 255;

// The probe's shapes: one row (MLAS's one-row kernel, its own code per instruction set) and a
// few (its matrix kernel), a depth of several pairs so a saturated pair shows in the sum.
const PROBE_ROWS = [1, 4];
const PROBE_DEPTH = 64;
const PROBE_COLUMNS = 16;

/**
 * MatMulIntegerToFloat's inputs for weights of `type`: uint8 activations and their zero point
 * always, the weights' zero point (the same 128) only when they are uint8; int8 weights are
 * symmetric. The prefill graph and the probe both build their products from this.
 */
export function integerProductInputs(type: WeightType, x: { a: string; w: string; aScale: string; wScale: string; zeroPoint: string }): string[] {
  return [x.a, x.w, x.aScale, x.wScale, x.zeroPoint, ...(type === 'uint8' ? [x.zeroPoint] : [])];
}

/** MatMulIntegerToFloat of uint8 activations at their largest and weights of `type` at theirs, zero points and scales as the prefill graph's. */
export function extremeProductGraph(type: WeightType): Uint8Array {
  const gb = new GraphBuilder();
  const a = gb.input('a', 'uint8', ['rows', PROBE_DEPTH]);
  const n = PROBE_DEPTH * PROBE_COLUMNS;
  const w = type === 'int8' ? gb.init('w', [PROBE_DEPTH, PROBE_COLUMNS], new Int8Array(n).fill(INT8_MAX), 'int8') : gb.init('w', [PROBE_DEPTH, PROBE_COLUMNS], new Uint8Array(n).fill(ZERO_POINT_UINT8 + INT8_MAX), 'uint8');
  const zp = gb.init('zero_point', [], Uint8Array.of(ZERO_POINT_UINT8), 'uint8');
  gb.op('MatMulIntegerToFloat', integerProductInputs(type, { a, w, aScale: gb.f32(1), wScale: gb.f32(1), zeroPoint: zp }), {}, ['y'], undefined, MS_DOMAIN);
  gb.output('y', 'float32', ['rows', PROBE_COLUMNS]);
  return gb.encode({ graphName: 'integer-products-probe', opset: 17, producer: 'cloudgate' }).model;
}

/** Whether this CPU's integer product of the largest values, weights of `type`, is exact. */
export async function extremeProductIsExact(type: WeightType): Promise<boolean> {
  const session = await ort.InferenceSession.create(extremeProductGraph(type), { intraOpNumThreads: 1, interOpNumThreads: 1, executionProviders: ['cpu'] });
  try {
    for (const rows of PROBE_ROWS) {
      const a = new ort.Tensor('uint8', new Uint8Array(rows * PROBE_DEPTH).fill(UINT8_MAX), [rows, PROBE_DEPTH]);
      const y = (await session.run({ a })).y!.data as Float32Array;
      if (!y.every((v) => v === (UINT8_MAX - ZERO_POINT_UINT8) * INT8_MAX * PROBE_DEPTH)) return false;
    }
    return true;
  } finally {
    await session.release();
  }
}

let measured: Promise<WeightType> | undefined;

/** int8 where this CPU's u8 x s8 product sums the largest values exactly, uint8 where it saturates; measured once a process. */
export function weightTypeHere(): Promise<WeightType> {
  measured ??= extremeProductIsExact('int8').then((exact) => (exact ? 'int8' : 'uint8'));
  return measured;
}
