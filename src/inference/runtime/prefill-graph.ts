import onnxProto from 'onnx-proto';

// The graph of a model with 4-bit weights for long steps (the "prefill" session of
// session-choice.ts): every 4-bit MatMulNBits rewritten as an 8-bit one holding the same
// values. onnxruntime's 4-bit kernel with int8 activations (`accuracy_level` 4, the
// converter's choice because it is the fastest for decode steps of a few rows) is slow for
// steps of hundreds of rows, and its 8-bit kernel is not: one m25 matrix at 380 rows on two
// threads took 1,913 us at 4 bits, 1,111 at 8 and 1,701 in float32 on a Zen 5 machine,
// 2,822 / 2,351 (8 bits in blocks of 64) / 4,070 on a Zen 4 and 3,701 / 3,026 / 3,496 on an
// Intel one (bench/README.md "Long steps in 8 bits"). A 4-bit value q with zero point z is
// the 8-bit value q + 120 with zero point z + 120 and the same scale: the weights are the
// same numbers, the activations are rounded the same way (int8 per block), so the answers
// differ only by the order of the sums. A 4-bit product this cannot widen (a zero point that
// is not uint8, weights that are not an initializer) multiplies in float32 instead
// (`accuracy_level` 0, the weights dequantized), as the whole graph did before.

const { onnx } = onnxProto;

/** The 4-bit products this rewrites. */
const NARROW_BITS = 4;
const WIDE_BITS = 8;
/** MatMulNBits' zero point when the node has none: 2^(bits-1). */
const DEFAULT_ZERO = { 4: 8, 8: 128 } as const;
/** q4 + 120 keeps w = (q - z) * scale with z = 8 + 120 = 128, 8 bits' default. */
const WIDEN_OFFSET = DEFAULT_ZERO[WIDE_BITS] - DEFAULT_ZERO[NARROW_BITS];
/** `accuracy_level` of the widened products: int8 activations, integer dot products (VNNI). */
const INT8_ACCURACY_LEVEL = 4;
/** `accuracy_level` that multiplies in float32 (onnxruntime's contrib op; 0 is also its default). */
const FLOAT32_ACCURACY_LEVEL = 0;

type Tensor = onnxProto.onnx.ITensorProto;
type Node = onnxProto.onnx.INodeProto;

function setAttr(node: Node, name: string, value: number): void {
  const attrs = (node.attribute ??= []);
  const a = attrs.find((x) => x.name === name);
  if (a) a.i = value;
  else attrs.push({ name, type: onnx.AttributeProto.AttributeType.INT, i: value });
}

const attr = (node: Node, name: string): number | undefined => {
  const a = node.attribute?.find((x) => x.name === name);
  return a ? Number(a.i) : undefined;
};

/** A uint8 initializer's bytes (onnx keeps them in raw_data, or one per int32_data entry). */
function uint8Data(t: Tensor): Uint8Array | undefined {
  if (t.dataType !== onnx.TensorProto.DataType.UINT8) return undefined;
  if (t.rawData?.length) return t.rawData;
  return t.int32Data?.length ? Uint8Array.from(t.int32Data) : undefined;
}

/**
 * The node's weights and zero points as 8-bit values, or undefined when they are not
 * uint8 initializers of the shapes MatMulNBits documents.
 */
function widened(node: Node, inits: Map<string, Tensor>): { weights: Uint8Array; zeros: Uint8Array | undefined; n: number; blocks: number; block: number } | undefined {
  const [, bName, , zName] = node.input ?? [];
  const K = attr(node, 'K');
  const N = attr(node, 'N');
  const block = attr(node, 'block_size');
  const packed = bName ? inits.get(bName) : undefined;
  const data = packed && uint8Data(packed);
  if (!K || !N || !block || !data) return undefined;
  const blocks = Math.ceil(K / block);
  if (data.length !== (N * blocks * block) / 2) return undefined;
  const weights = new Uint8Array(data.length * 2);
  for (let i = 0; i < data.length; i++) {
    weights[2 * i] = (data[i]! & 0xf) + WIDEN_OFFSET;
    weights[2 * i + 1] = (data[i]! >> 4) + WIDEN_OFFSET;
  }
  if (!zName) return { weights, zeros: undefined, n: N, blocks, block };
  const z = inits.get(zName);
  const zData = z && uint8Data(z);
  const perColumn = Math.ceil(blocks / 2); // two blocks' zero points a byte, each column padded to a byte
  if (!zData || zData.length !== N * perColumn) return undefined;
  const zeros = new Uint8Array(N * blocks);
  for (let n = 0; n < N; n++) {
    for (let b = 0; b < blocks; b++) zeros[n * blocks + b] = ((zData[n * perColumn + (b >> 1)]! >> (4 * (b & 1))) & 0xf) + WIDEN_OFFSET;
  }
  return { weights, zeros, n: N, blocks, block };
}

/**
 * The graph `bytes` with every 4-bit MatMulNBits widened to 8 bits (or, where it cannot be,
 * multiplying in float32), or undefined when it has none (nothing to gain) or keeps its weights
 * in a side file (a graph loaded from memory could not find it).
 */
export function prefillGraph(bytes: Uint8Array): Uint8Array | undefined {
  const model = onnx.ModelProto.decode(bytes);
  const graph = model.graph;
  if (!graph) return undefined;
  const initializers = graph.initializer ?? [];
  if (initializers.some((t) => t.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL)) return undefined;
  const inits = new Map(initializers.map((t) => [t.name!, t]));
  // An initializer another node also reads (tied embeddings) is left as it is, and the widened copy added.
  const readers = new Map<string, number>();
  for (const node of graph.node ?? []) for (const name of node.input ?? []) readers.set(name, (readers.get(name) ?? 0) + 1);
  const widenedNames = new Map<string, string>(); // two 4-bit products of one matrix share its widened copy
  const replace = (name: string, t: Tensor): string => {
    const done = widenedNames.get(name);
    if (done) return done;
    const own = readers.get(name) === 1;
    const newName = own ? name : `${name}.wide${WIDE_BITS}`;
    const tensor = { ...t, name: newName };
    if (own) initializers[initializers.indexOf(inits.get(name)!)] = tensor;
    else initializers.push(tensor);
    widenedNames.set(name, newName);
    return newName;
  };
  let changed = 0;
  for (const node of graph.node ?? []) {
    if (node.opType !== 'MatMulNBits' || (attr(node, 'bits') ?? NARROW_BITS) !== NARROW_BITS) continue;
    const w = widened(node, inits);
    if (w) {
      const inputs = node.input!;
      inputs[1] = replace(inputs[1]!, { dataType: onnx.TensorProto.DataType.UINT8, dims: [w.n, w.blocks, w.block], rawData: w.weights });
      if (w.zeros) inputs[3] = replace(inputs[3]!, { dataType: onnx.TensorProto.DataType.UINT8, dims: [w.zeros.length], rawData: w.zeros });
      setAttr(node, 'bits', WIDE_BITS);
      setAttr(node, 'accuracy_level', INT8_ACCURACY_LEVEL);
      changed++;
    } else if ((attr(node, 'accuracy_level') ?? FLOAT32_ACCURACY_LEVEL) !== FLOAT32_ACCURACY_LEVEL) {
      setAttr(node, 'accuracy_level', FLOAT32_ACCURACY_LEVEL);
      changed++;
    }
  }
  graph.initializer = initializers;
  return changed > 0 ? onnx.ModelProto.encode(model).finish() : undefined;
}
