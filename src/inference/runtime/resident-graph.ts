import onnxProto from 'onnx-proto';
import { bytesOf } from '../convert/onnx-graph.js';
import { DEVICE_PASSES, type DevicePass } from './device-passes.js';

// The slot-cache graph rewritten for a cache that stays on the device (kv-resident.ts): on a GPU
// provider, the slot graph's cache inputs were the worker's host buffers, so every step copied
// every row's whole cache to the device and its new keys and values back (16 rows of m25 at a
// capacity of 96: 50 MB up a step; webgpu on an H100 ran 16 streams at 0.11 of the same machine's
// CPU, bench/README.md "GPU again"). Here the cache is one device tensor that each step reads and
// returns updated, which onnxruntime-node keeps on the device (`preferredOutputLocation:
// 'gpu-buffer'`) and the next step is fed as it is:
//
// Inputs:  kv_cache [2 * layers * slots, n_kv_heads, capacity, head_size]: layer l's keys of slot s
//            at 2 * l * slots + s, its values at (2 * l + 1) * slots + s;
//          kv_rows [2 * layers, B] int64: where each of the step's rows reads its keys and values;
//          kv_write [2 * layers * B, n_kv_heads, S, 1] int64: where each new key and value goes,
//            as a row of kv_cache seen as [2 * layers * slots * n_kv_heads * capacity, head_size];
//          the slot graph's other inputs as they were (cache_bias covers the capacity).
// Outputs: logits as they were; kv_cache_out, kv_cache with the step's keys and values written.
//
// The rows' caches are gathered in one Gather and a few Splits (the slot graph's `cache.N.key|value`
// inputs become those), and the new keys and values written by one ScatterND: five kernels a
// step more than the slot graph for m25 (16 keys and values), six for m110 (24). A slot's rows need not be consecutive, so
// rows joining or leaving move no cache. Growing the cache (more slots, more capacity) is the
// grow graph's, run only when it grows.

const { onnx } = onnxProto;
const DT = onnx.TensorProto.DataType;
type ValueInfo = onnxProto.onnx.IValueInfoProto;

/**
 * Outputs of one Split at most: its shader binds its input and every output as storage buffers,
 * and WebGPU's default limit is 8 a shader stage (lavapipe's adapter gives 16; one Split of m25's
 * 16 keys and values needed 17 and failed there).
 */
const SPLIT_OUTPUTS_MAX = 7;
/** Names this adds begin with this. */
const PREFIX = 'cloudgate.resident';

const dim = (d: number | string) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d });
const valueInfo = (name: string, elemType: number, dims: Array<number | string>): ValueInfo => ({
  name,
  type: { tensorType: { elemType, shape: { dim: dims.map(dim) } } },
});

/** An int64 initializer of `values`. */
const i64Init = (name: string, values: number[]) => ({ name, dataType: DT.INT64, dims: [values.length], rawData: bytesOf(BigInt64Array.from(values.map(BigInt))) });

/** A node named after its first output, with integer attributes. */
const intNode = (opType: string, input: string[], output: string[], attrs: Record<string, number> = {}) => ({
  opType,
  input,
  output,
  name: output[0],
  attribute: Object.entries(attrs).map(([name, i]) => ({ name, type: onnx.AttributeProto.AttributeType.INT, i })),
});

/** The cache layout the rewritten graph was made for: what the worker lays kv_cache out by. */
export interface ResidentLayout {
  layers: number;
  kvHeads: number;
  headDim: number;
}

/**
 * The slot-cache graph `bytes` rewritten for a device-resident cache, or undefined where it is not
 * a slot-cache graph with one `new_key_values` output (folders converted before cloudgate-convert/4).
 * Weights in a file beside the graph (ONNX external data: every model past 2 GB, and the converter's
 * above EXTERNAL_DATA_THRESHOLD_BYTES) stay there; the session finds them by external-data.ts rewrittenGraphSessionConfig.
 * `passes` take out kernels the converter put in for the CPU (device-passes.ts); the benchmark
 * passes none to measure them.
 */
export function residentGraph(bytes: Uint8Array, layout: ResidentLayout, passes: readonly DevicePass[] = DEVICE_PASSES): Uint8Array | undefined {
  const model = onnx.ModelProto.decode(bytes);
  const graph = model.graph;
  if (!graph?.node || !graph.input || !graph.output) return undefined;
  const { layers: L, kvHeads: KV, headDim: hd } = layout;
  const cacheNames = Array.from({ length: L }, (_, l) => [`cache.${l}.key`, `cache.${l}.value`]).flat();
  const inputs = new Set(graph.input.map((i) => i.name));
  if (!cacheNames.every((n) => inputs.has(n)) || !graph.output.some((o) => o.name === 'new_key_values')) return undefined;
  const added: onnxProto.onnx.ITensorProto[] = [];
  const i64 = (name: string, values: number[]) => {
    added.push(i64Init(`${PREFIX}.${name}`, values));
    return `${PREFIX}.${name}`;
  };
  const node = (opType: string, input: string[], output: string[], attrs: Record<string, number> = {}) => ({ ...intNode(opType, input, output, attrs), name: `${PREFIX}.${opType}.${output[0]}` });
  const gathered = `${PREFIX}.rows`;
  const parts = cacheNames.map((n) => `${PREFIX}.part.${n}`);
  const flat = `${PREFIX}.flat`;
  const written = `${PREFIX}.written`;
  const shape = `${PREFIX}.shape`;
  // [2L, B, KV, C, hd] split in groups of at most SPLIT_OUTPUTS_MAX, then each group into its
  // [1, B, KV, C, hd] parts: one Split of 2L outputs is one shader of 2L + 1 storage buffers.
  const groups: Array<{ name: string; parts: string[] }> = [];
  for (let at = 0; at < parts.length; at += SPLIT_OUTPUTS_MAX) groups.push({ name: `${PREFIX}.group.${groups.length}`, parts: parts.slice(at, at + SPLIT_OUTPUTS_MAX) });
  const splits =
    groups.length === 1
      ? [node('Split', [gathered, i64('split', parts.map(() => 1))], parts, { axis: 0 })]
      : [
          node('Split', [gathered, i64('split_groups', groups.map((g) => g.parts.length))], groups.map((g) => g.name), { axis: 0 }),
          ...groups.map((g, i) => node('Split', [g.name, i64(`split_group_${i}`, g.parts.map(() => 1))], g.parts, { axis: 0 })),
        ];
  const axis0 = i64('axis0', [0]);
  const nodes = [
    // [2L * slots, KV, C, hd] gathered by [2L, B] -> [2L, B, KV, C, hd], one [1, B, KV, C, hd] a layer's keys or values.
    node('Gather', ['kv_cache', 'kv_rows'], [gathered], { axis: 0 }),
    ...splits,
    ...parts.map((p, i) => node('Squeeze', [p, axis0], [cacheNames[i]!])),
    node('Reshape', ['kv_cache', i64('rows_of_head_size', [-1, hd])], [flat]),
    node('ScatterND', [flat, 'kv_write', 'new_key_values'], [written]),
    node('Shape', ['kv_cache'], [shape]),
    node('Reshape', [written, shape], ['kv_cache_out']),
  ];
  graph.initializer = [...(graph.initializer ?? []), ...added];
  graph.node.push(...nodes);
  graph.input = [
    ...graph.input.filter((i) => !cacheNames.includes(i.name!)),
    valueInfo('kv_cache', DT.FLOAT, ['kv_cache_rows', KV, 'cache_capacity', hd]),
    valueInfo('kv_rows', DT.INT64, [2 * L, 'batch_size']),
    valueInfo('kv_write', DT.INT64, ['new_rows', KV, 'sequence_length', 1]),
  ];
  graph.output = [...graph.output.filter((o) => o.name !== 'new_key_values'), valueInfo('kv_cache_out', DT.FLOAT, ['kv_cache_rows', KV, 'cache_capacity', hd])];
  // The slot graph's value_info may name the replaced inputs' shapes: they are intermediate now, and
  // onnxruntime infers them.
  graph.valueInfo = (graph.valueInfo ?? []).filter((v) => !cacheNames.includes(v.name!));
  for (const pass of passes) pass.apply(graph);
  return onnx.ModelProto.encode(model).finish();
}

/**
 * The grow graph: `kv_cache` [2L * slots, KV, C, hd], seen as [2L, slots, KV, C, hd], padded with
 * zeros by `pads` [10] int64 (onnx Pad's: begins, then ends; only the ends of the slots' and the
 * positions' axes are ever set), returned flat again as `kv_cache_out`. Run only when the cache
 * grows; its output stays on the device as the step's does.
 */
export function growGraph(layout: ResidentLayout, opset: number): Uint8Array {
  const { layers: L, kvHeads: KV, headDim: hd } = layout;
  const i64 = i64Init;
  const n = (opType: string, input: string[], output: string, attrs: Record<string, number> = {}) => intNode(opType, input, [output], attrs);
  const model = onnx.ModelProto.create({
    irVersion: 8,
    opsetImport: [{ domain: '', version: opset }],
    producerName: 'cloudgate',
    graph: {
      name: 'cloudgate_kv_grow',
      initializer: [i64('layers_slots_heads', [2 * L, -1, KV]), i64('rows_heads', [-1, KV]), i64('head_size', [hd]), i64('two', [2]), i64('three', [3]), i64('four', [4])],
      node: [
        // The capacity is the input's axis 2 and the padded one's axis 3, read from their shapes (shape arithmetic stays on the host).
        n('Shape', ['kv_cache'], 'shape'),
        n('Slice', ['shape', 'two', 'three'], 'capacity'),
        n('Concat', ['layers_slots_heads', 'capacity', 'head_size'], 'layered_shape', { axis: 0 }),
        n('Reshape', ['kv_cache', 'layered_shape'], 'layered'),
        n('Pad', ['layered', 'pads'], 'padded'),
        n('Shape', ['padded'], 'padded_shape'),
        n('Slice', ['padded_shape', 'three', 'four'], 'grown_capacity'),
        n('Concat', ['rows_heads', 'grown_capacity', 'head_size'], 'flat_shape', { axis: 0 }),
        n('Reshape', ['padded', 'flat_shape'], 'kv_cache_out'),
      ],
      input: [valueInfo('kv_cache', DT.FLOAT, ['kv_cache_rows', KV, 'cache_capacity', hd]), valueInfo('pads', DT.INT64, [10])],
      output: [valueInfo('kv_cache_out', DT.FLOAT, ['grown_rows', KV, 'grown_capacity', hd])],
    },
  });
  return onnx.ModelProto.encode(model).finish();
}
