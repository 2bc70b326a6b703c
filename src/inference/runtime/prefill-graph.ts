import onnxProto from 'onnx-proto';

// The graph of a model with 4-bit weights for long steps (the "prefill" session of
// session-choice.ts). onnxruntime's MatMulNBits computes as its `accuracy_level` attribute
// says: 4 quantizes each step's activations to int8 and multiplies with integer dot products
// (VNNI), the converter's choice (MATMUL_NBITS_ACCURACY_LEVEL) because it is the faster one for
// decode steps of a few rows; 0 dequantizes the weights and multiplies in float32, and for a
// prompt of hundreds of tokens that can be the faster one: m25 int4's 512-token prompt step
// took 262 ms at 4 and 226 at 0 on an Intel AVX-512 VNNI machine, where on the AMD machine of
// the first int4 figures 0 was twice as slow at 256 rows (bench/README.md "Long steps in
// float32"). The same weights, so the answers differ only by the activations' rounding; which
// is faster is measured as the steps run.

const { onnx } = onnxProto;

/** MatMulNBits' accuracy_level that multiplies in float32 (onnxruntime's contrib op; 0 is also its default). */
const FLOAT32_ACCURACY_LEVEL = 0;
/** Only 4-bit products: at 8 bits the float32 kernel was slower at every size measured (bench/matmul-nbits.ts). */
const PREFILL_GRAPH_BITS = 4;

/**
 * The graph `bytes` with every 4-bit MatMulNBits multiplying in float32, or undefined when it has
 * none that does otherwise (nothing to gain) or keeps its weights in a side file (a graph loaded
 * from memory could not find it).
 */
export function prefillGraph(bytes: Uint8Array): Uint8Array | undefined {
  const model = onnx.ModelProto.decode(bytes);
  const graph = model.graph;
  if (!graph) return undefined;
  if ((graph.initializer ?? []).some((t) => t.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL)) return undefined;
  let changed = 0;
  for (const node of graph.node ?? []) {
    if (node.opType !== 'MatMulNBits') continue;
    const attrs = node.attribute ?? [];
    const bits = attrs.find((a) => a.name === 'bits');
    if (Number(bits?.i ?? PREFILL_GRAPH_BITS) !== PREFILL_GRAPH_BITS) continue;
    const level = attrs.find((a) => a.name === 'accuracy_level');
    if (!level || Number(level.i) === FLOAT32_ACCURACY_LEVEL) continue;
    level.i = FLOAT32_ACCURACY_LEVEL;
    changed++;
  }
  return changed > 0 ? onnx.ModelProto.encode(model).finish() : undefined;
}
