import onnxProto from 'onnx-proto';
import { fp16BitsToFp32 } from '../convert/quantize.js';
import { bytesOf } from '../convert/onnx-graph.js';
import { INT8_MAX, integerProductInputs, ZERO_POINT_UINT8, type WeightType } from './integer-products.js';
import { isExternal, withData } from './external-data.js';

// The graph of a model with block-quantized weights (MatMulNBits, 4 or 8 bits) for long steps
// (the "prefill" session of session-choice.ts): every such product rewritten as an integer matrix
// product of int8 weights and int8 activations, onnxruntime's `MatMulIntegerToFloat`.
//
// Why: MatMulNBits (the converter's choice: it is the fastest for decode steps of a row or a
// few) is slow for steps of hundreds of rows, while onnxruntime's general integer product
// (MLAS QGEMM, tuned with VNNI and, where the CPU has it, AMX tiles) is not. One m25 matrix at
// 380 rows on two threads, one Intel machine with AMX: 2,289 us at 4 bits, 1,804 at 8, 1,639 in
// float32, 553 here (bench/README.md "Long steps in integers").
//
// What it computes: the weights are MatMulNBits' own values (dequantized, the zero points
// applied), rounded again to int8 per output column (a column's largest value is 127; stored
// as uint8 around 128 on a CPU whose u8 x s8 product saturates, integer-products.ts); the
// activations are rounded to int8 per row (a row's largest magnitude is 127), where
// MatMulNBits with `accuracy_level` 4 rounds them per block of 32. Both roundings are below
// the 4-bit grid's: the answers differ from MatMulNBits' by about as much as MatMulNBits'
// own int8 activations differ from float32 (prefill-graph.test.ts bounds it). Each row is
// rounded on its own, so a row's answer does not depend on the other rows of its step.
//
// A product this cannot rewrite (weights not in initializers, a `g_idx` or `bias` input) is
// left as it is, except that a 4-bit one multiplies in float32 (`accuracy_level` 0), faster
// at long steps than its int8 kernel.
//
// This graph runs on the CPU only, so it also takes one CPU-only rewrite of the attention
// (transposedOperandsAsTransB, below).

const { onnx } = onnxProto;
const DT = onnx.TensorProto.DataType;

/** A row of zeros keeps a finite reciprocal of its scale (its products are 0 either way). */
const ROW_SCALE_FLOOR = 1e-30;
/** `accuracy_level` that multiplies in float32 (onnxruntime's contrib op; 0 is also its default). */
export const FLOAT32_ACCURACY_LEVEL = 0;
/** The opset from which ReduceMax takes its axes as an input instead of an attribute. */
const REDUCE_AXES_INPUT_OPSET = 18;
/** Names this adds to a graph begin with this. */
const PREFIX = 'cloudgate.int8';
/**
 * Bytes the rewritten graph may take: protobuf's bound on one message, which onnxruntime reads a
 * graph from memory as (2 GiB, less a margin for the encoding). The int8 weights it adds are one
 * byte a parameter, so a model of more than ~2 billion parameters has no prefill graph.
 */
const GRAPH_BYTES_MAX = 2 ** 31 - 2 ** 24;

type Tensor = onnxProto.onnx.ITensorProto;
type Node = onnxProto.onnx.INodeProto;
type Graph = onnxProto.onnx.IGraphProto;

const attr = (node: Node, name: string): number | undefined => {
  const a = node.attribute?.find((x) => x.name === name);
  return a ? Number(a.i) : undefined;
};

function setAttr(node: Node, name: string, value: number): void {
  const attrs = (node.attribute ??= []);
  const a = attrs.find((x) => x.name === name);
  if (a) a.i = value;
  else attrs.push({ name, type: onnx.AttributeProto.AttributeType.INT, i: value });
}

/** A uint8 initializer's bytes (onnx keeps them in raw_data, or one per int32_data entry). */
function uint8Data(t: Tensor): Uint8Array | undefined {
  if (t.dataType !== DT.UINT8) return undefined;
  if (t.rawData?.length) return t.rawData;
  return t.int32Data?.length ? Uint8Array.from(t.int32Data) : undefined;
}

/** An int64 initializer's values, or undefined when it is none. */
function int64Data(t: Tensor | undefined): number[] | undefined {
  if (t?.dataType !== DT.INT64) return undefined;
  const raw = t.rawData;
  if (raw?.length) return Array.from(new BigInt64Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)), Number);
  return t.int64Data?.map((v) => (typeof v === 'object' ? v.toNumber() : Number(v)));
}

/** A float32 or float16 initializer's values as float32. */
function floatData(t: Tensor): Float32Array | undefined {
  const raw = t.rawData;
  if (t.dataType === DT.FLOAT) {
    if (raw?.length) return new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
    return t.floatData?.length ? Float32Array.from(t.floatData) : undefined;
  }
  if (t.dataType === DT.FLOAT16) {
    if (raw?.length) return Float32Array.from(new Uint16Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)), fp16BitsToFp32);
    return t.int32Data?.length ? Float32Array.from(t.int32Data, fp16BitsToFp32) : undefined;
  }
  return undefined;
}

/**
 * The node's weights rounded to int8 per output column ([K, N] row-major, as MatMul reads them;
 * a column's largest magnitude at INT8_MAX), as bytes of `weightType` (uint8: offset by
 * ZERO_POINT_UINT8), with a float32 scale per column; undefined when they, their scales or zero
 * points are not initializers of the shapes MatMulNBits documents. One column at a time (the
 * block-quantized data is column-major): m110's prefill graph took 2.9 s to make through a whole
 * float32 copy rounded afterwards, 2.0 s this way.
 */
function perColumnInt8(node: Node, init: (name: string) => Tensor | undefined, weightType: WeightType): { q: Uint8Array; scale: Float32Array } | undefined {
  const [, bName, sName, zName] = node.input ?? [];
  const K = attr(node, 'K');
  const N = attr(node, 'N');
  const bits = attr(node, 'bits') ?? 4;
  const block = attr(node, 'block_size');
  const [b, s] = [bName ? init(bName) : undefined, sName ? init(sName) : undefined];
  const data = b && uint8Data(b);
  const scales = s && floatData(s);
  if (!K || !N || !block || !data || !scales || (bits !== 4 && bits !== 8)) return undefined;
  const blocks = Math.ceil(K / block);
  const blob = (block * bits) / 8;
  if (data.length !== N * blocks * blob || scales.length !== N * blocks) return undefined;
  // Zero points: none (2^(bits-1)), uint8 (packed 8 / bits a byte, each column padded to a byte) or float.
  let zero: (n: number, b: number) => number = () => 2 ** (bits - 1);
  if (zName) {
    const z = init(zName);
    if (!z) return undefined;
    const zBytes = uint8Data(z);
    const zFloat = zBytes ? undefined : floatData(z);
    const perColumn = Math.ceil((blocks * bits) / 8);
    if (zBytes && zBytes.length === N * perColumn) {
      zero = bits === 8 ? (n, b) => zBytes[n * perColumn + b]! : (n, b) => (zBytes[n * perColumn + (b >> 1)]! >> (4 * (b & 1))) & 0xf;
    } else if (zFloat && zFloat.length === N * blocks) zero = (n, b) => zFloat[n * blocks + b]!;
    else return undefined;
  }
  const offset = weightType === 'uint8' ? ZERO_POINT_UINT8 : 0;
  const q = new Uint8Array(K * N); // int8 as two's complement bytes, or uint8 around the zero point
  const scale = new Float32Array(N);
  const column = new Float32Array(K);
  for (let n = 0; n < N; n++) {
    let amax = 0;
    for (let b = 0; b < blocks; b++) {
      const s = scales[n * blocks + b]!;
      const z = zero(n, b);
      const at = (n * blocks + b) * blob;
      const count = Math.min(block, K - b * block);
      for (let j = 0; j < count; j++) {
        const v = ((bits === 8 ? data[at + j]! : (data[at + (j >> 1)]! >> (4 * (j & 1))) & 0xf) - z) * s;
        column[b * block + j] = v;
        amax = Math.max(amax, Math.abs(v));
      }
    }
    scale[n] = amax > 0 ? amax / INT8_MAX : 1;
    const inverse = 1 / scale[n]!;
    // & 0xff: a negative int8 as its two's complement byte (no offset), or nothing to wrap (offset 128).
    for (let k = 0; k < K; k++) q[k * N + n] = (Math.round(column[k]! * inverse) + offset) & 0xff;
  }
  return { q, scale };
}

/**
 * The graph `bytes` with every MatMulNBits product it can rewrite as an int8 one (see above),
 * or undefined when it has none (nothing to gain). `weightType`: how the weights are stored, this
 * CPU's `weightTypeHere()` (integer-products.ts). Weights kept in a file beside the graph are read
 * from `dir`, the model file's folder; the ones the rewrite leaves stay there, so its session loads
 * with external-data.ts `rewrittenGraphSessionConfig`. Throws where they are and no `dir` is given,
 * or where the graph would pass GRAPH_BYTES_MAX.
 */
export function prefillGraph(bytes: Uint8Array, weightType: WeightType, dir?: string): Uint8Array | undefined {
  const model = onnx.ModelProto.decode(bytes);
  const graph = model.graph;
  if (!graph) return undefined;
  const initializers = graph.initializer ?? [];
  if (!dir && initializers.some(isExternal)) throw new Error('its weights lie in a file beside the graph, and no folder was given to read them from');
  // Read from the file only when a rewrite needs them: the block-quantized weights go once made int8.
  const inits = new Map(initializers.map((t) => [t.name!, t]));
  const dataOf = (name: string): Tensor | undefined => {
    const t = inits.get(name);
    return t && dir ? withData(t, dir) : t;
  };
  const opset = Number(model.opsetImport?.find((o) => !o.domain || o.domain === 'ai.onnx')?.version ?? 0);
  const added: Tensor[] = [];
  const constant = (name: string, t: Omit<Tensor, 'name'>): string => {
    const full = `${PREFIX}.${name}`;
    if (!added.some((a) => a.name === full)) added.push({ ...t, name: full });
    return full;
  };
  const f32 = (name: string, v: number) => constant(name, { dataType: DT.FLOAT, dims: [], rawData: bytesOf(Float32Array.of(v)) });
  const zp = () => constant('zero_point', { dataType: DT.UINT8, dims: [], rawData: Uint8Array.of(ZERO_POINT_UINT8) });
  let fresh = 0;
  const out = (what: string) => `${PREFIX}.${what}.${fresh++}`;
  const nodes: Node[] = [];
  const op = (opType: string, input: string[], attrs: Record<string, number | number[]> = {}, domain?: string, output = out(opType)): string => {
    const attribute = Object.entries(attrs).map(([name, v]) =>
      Array.isArray(v) ? { name, type: onnx.AttributeProto.AttributeType.INTS, ints: v } : { name, type: onnx.AttributeProto.AttributeType.INT, i: v },
    );
    nodes.push({ opType, input, output: [output], name: output, attribute, ...(domain ? { domain } : {}) });
    return output;
  };
  // One rounding per activation tensor, however many products read it.
  const rounded = new Map<string, { q: string; scale: string }>();
  const roundRows = (x: string): { q: string; scale: string } => {
    const hit = rounded.get(x);
    if (hit) return hit;
    const abs = op('Abs', [x]);
    const scale =
      opset >= REDUCE_AXES_INPUT_OPSET
        ? op('ReduceMax', [abs, constant('last_axis', { dataType: DT.INT64, dims: [1], rawData: bytesOf(BigInt64Array.of(-1n)) })], { keepdims: 1 })
        : op('ReduceMax', [abs], { axes: [-1], keepdims: 1 });
    const inverse = op('Div', [f32('int8_max', INT8_MAX), op('Max', [scale, f32('row_scale_floor', ROW_SCALE_FLOOR)])]);
    const q = op('QuantizeLinear', [op('Mul', [x, inverse]), f32('one', 1), zp()]);
    const r = { q, scale };
    rounded.set(x, r);
    return r;
  };
  const weightsDone = new Map<string, { q: string; scale: string }>(); // two products of one matrix share its copy
  const replacedWeights = new Set<string>();
  let changed = 0;
  for (const node of graph.node ?? []) {
    const inputs = node.input ?? [];
    if (node.opType !== 'MatMulNBits' || (node.domain ?? '') !== 'com.microsoft') {
      nodes.push(node);
      continue;
    }
    const K = attr(node, 'K')!;
    const N = attr(node, 'N')!;
    const key = inputs.slice(1, 4).join('|');
    let weights = weightsDone.get(key);
    if (!weights && inputs.length <= 4) {
      const c = perColumnInt8(node, dataOf, weightType);
      if (c) {
        weights = { q: out('weights'), scale: out('column_scales') };
        added.push({ name: weights.q, dims: [K, N], dataType: weightType === 'int8' ? DT.INT8 : DT.UINT8, rawData: c.q });
        added.push({ name: weights.scale, dataType: DT.FLOAT, dims: [N], rawData: bytesOf(c.scale) });
        weightsDone.set(key, weights);
      }
    }
    if (!weights) {
      if ((attr(node, 'bits') ?? 4) === 4 && (attr(node, 'accuracy_level') ?? FLOAT32_ACCURACY_LEVEL) !== FLOAT32_ACCURACY_LEVEL) {
        setAttr(node, 'accuracy_level', FLOAT32_ACCURACY_LEVEL);
        changed++;
      }
      nodes.push(node);
      continue;
    }
    for (const name of inputs.slice(1, 4)) if (name) replacedWeights.add(name);
    // A float16 model (q4f16) computes here in float32 between two casts.
    const half = inits.get(inputs[2]!)?.dataType === DT.FLOAT16;
    const x = half ? op('Cast', [inputs[0]!], { to: DT.FLOAT }) : inputs[0]!;
    const a = roundRows(x);
    // x . w = (sum of q_x q_w) * (row scale / 127) * column scale, the 1/127 as the product's own A scale.
    const productInputs = integerProductInputs(weightType, { a: a.q, w: weights.q, aScale: f32('inverse_int8_max', 1 / INT8_MAX), wScale: weights.scale, zeroPoint: zp() });
    const product = op('MatMulIntegerToFloat', productInputs, {}, 'com.microsoft');
    const y = node.output![0]!;
    if (half) op('Cast', [op('Mul', [product, a.scale])], { to: DT.FLOAT16 }, undefined, y);
    else op('Mul', [product, a.scale], {}, undefined, y);
    changed++;
  }
  if (!changed) return undefined;
  // The block-quantized copies no remaining node reads are dropped: the session holds the int8 ones only.
  const read = new Set(nodes.flatMap((n) => n.input ?? []));
  const kept = initializers.filter((t) => !replacedWeights.has(t.name!) || read.has(t.name!));
  // Checked before encoding: the bytes held inline, the dropped copies' out and the int8 ones in.
  const inline = (ts: Tensor[]) => ts.reduce((n, t) => n + (t.rawData?.byteLength ?? 0), 0);
  const estimate = bytes.byteLength - inline(initializers) + inline(kept) + inline(added);
  if (estimate > GRAPH_BYTES_MAX) throw new Error(`its int8 products would take a graph of about ${estimate} bytes, over the ${GRAPH_BYTES_MAX} onnxruntime reads one from memory as`);
  graph.initializer = [...kept, ...added];
  graph.node = nodes;
  transposedOperandsAsTransB(nodes, dataOf);
  layerOutputs(graph);
  return onnx.ModelProto.encode(model).finish();
}

/**
 * A MatMul whose second operand is a Transpose swapping the last two axes, seen through an
 * Unsqueeze (the branch graph's own keys, [B, KV, T, hd] -> [KV, 1, B, hd, T]), becomes
 * onnxruntime's FusedMatMul with `transB`, and the Transpose keeps the last two axes in place:
 * its copy then moves rows of head size instead of single floats. onnxruntime fuses a Transpose
 * into a MatMul only when it reads it directly and swaps nothing else. A 64-question branch
 * step of m25 on two threads: 5-12 % faster at fp32, int8 and q4, the answers the same to 1e-6
 * (bench/README.md "Long steps in integers"). Only for this CPU graph: onnxruntime's webgpu
 * provider has no FusedMatMul.
 */
function transposedOperandsAsTransB(nodes: Node[], init: (name: string) => Tensor | undefined): void {
  const producer = new Map<string, Node>();
  const readers = new Map<string, number>();
  for (const n of nodes) {
    for (const o of n.output ?? []) producer.set(o, n);
    for (const i of n.input ?? []) readers.set(i, (readers.get(i) ?? 0) + 1);
  }
  const ints = (n: Node, name: string) => n.attribute?.find((a) => a.name === name)?.ints?.map(Number);
  for (const mm of nodes) {
    if (mm.opType !== 'MatMul' || (mm.domain ?? '') !== '') continue;
    const un = producer.get(mm.input![1]!);
    const tr = un?.opType === 'Unsqueeze' ? producer.get(un.input![0]!) : undefined;
    const perm = tr?.opType === 'Transpose' ? ints(tr, 'perm') : undefined;
    // Unsqueeze's axes: an initializer input from opset 13 on, an attribute before.
    const axes = un && (un.input![1] ? int64Data(init(un.input![1])) : ints(un, 'axes'));
    if (!un || !tr || !perm || perm.length < 2 || readers.get(un.output![0]!) !== 1 || readers.get(tr.output![0]!) !== 1) continue;
    if (!axes || axes.some((a) => a < 0 || a >= perm.length + axes.length - 2)) continue; // the last two axes must stay last
    const r = perm.length;
    // Only where the Transpose's last two axes are its input's last two, swapped: kept in place, they copy as rows.
    if (perm[r - 2] !== r - 1 || perm[r - 1] !== r - 2) continue;
    tr.attribute!.find((x) => x.name === 'perm')!.ints = [...perm.slice(0, r - 2), r - 2, r - 1];
    mm.opType = 'FusedMatMul';
    mm.domain = 'com.microsoft';
    mm.attribute = [{ name: 'transB', type: onnx.AttributeProto.AttributeType.INT, i: 1 }];
  }
}

/**
 * The step's new keys and values as one output a layer's keys or values (`new.N.key|value`, as
 * folders converted before cloudgate-convert/5 gave them; kv-slots.ts slotStepDone reads either)
 * instead of their Concat into `new_key_values`, in this graph and so in the long-step graph made
 * from it. onnxruntime-node 1.30 copies each output into a new ArrayBuffer: one of a long step's
 * size (74 MB for 1,000 tokens of m110, 38 MB for 512) is a fresh mapping each step, 18,000 page
 * faults that took 30-230 ms of a 330 ms step in the daemon, where outputs of a layer's size (3 MB)
 * come from memory malloc keeps: 0-3,800 faults after the first two steps. A 512-token prompt of
 * m110 int4 took 0.844 of the time to its first token, one stream and 16 streams of short prompts
 * even (bench/README.md "A long prompt after short ones").
 */
function layerOutputs(g: Graph): void {
  const at = g.node!.findIndex((n) => n.output?.[0] === 'new_key_values' && n.opType === 'Concat');
  const out = g.output!.find((o) => o.name === 'new_key_values');
  if (at < 0 || !out) return;
  // Its inputs renamed where they are made and read, so that no copy is left between.
  const rename = new Map(g.node![at]!.input!.map((src, k) => [src, `new.${Math.floor(k / 2)}.${k % 2 ? 'value' : 'key'}`]));
  g.node!.splice(at, 1);
  for (const n of g.node!) {
    n.input = n.input!.map((x) => rename.get(x) ?? x);
    n.output = n.output!.map((x) => rename.get(x) ?? x);
  }
  for (const v of g.valueInfo ?? []) v.name = rename.get(v.name!) ?? v.name;
  g.output = [...g.output!.filter((o) => o !== out), ...[...rename.values()].map((name) => ({ name, type: out.type }))];
}
