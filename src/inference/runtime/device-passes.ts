import onnxProto from 'onnx-proto';

// Rewrites of the slot graph for a GPU provider, applied with the device-resident cache
// (resident-graph.ts). On webgpu one decode step of m25 is bound by the host issuing it, not by
// the GPU: an H200 took 7.2 of a step's 8.3 ms to issue ~290 kernels, one at a time through
// onnxruntime and Dawn (bench/README.md "GPU on an H200 with this build"). Each pass takes out
// kernels the converter put in for the CPU; what each saves on a GPU is measured by
// `bench/webgpu-passes.ts`.

type Graph = onnxProto.onnx.IGraphProto;
type Node = onnxProto.onnx.INodeProto;

export interface DevicePass {
  name: string;
  /** Rewrites `graph` in place; returns how many nodes it changed or took out (0: nothing to do). */
  apply: (graph: Graph) => number;
}

/** Where each value is read: node inputs and graph outputs. */
function readers(graph: Graph): Map<string, number> {
  const n = new Map<string, number>();
  for (const node of graph.node ?? []) for (const i of node.input ?? []) n.set(i, (n.get(i) ?? 0) + 1);
  for (const o of graph.output ?? []) n.set(o.name!, (n.get(o.name!) ?? 0) + 1);
  return n;
}

/**
 * The softmax floor out (onnx-attention.ts softmaxNoDenormals): `Max(x, ReduceMax(x) - c)` before
 * each Softmax keeps its scores out of the range where exp() gives denormal floats, which x86
 * CPUs compute slowly. A GPU computes them at full speed (or flushes them to zero), and Softmax
 * subtracts the row's max itself, so on the device the floor is three kernels a layer that change
 * nothing but weights below 1e-26.
 */
export const dropSoftmaxFloor: DevicePass = {
  name: 'softmax floor',
  apply(graph) {
    const nodes = graph.node ?? [];
    const producer = new Map<string, Node>();
    for (const node of nodes) for (const o of node.output ?? []) producer.set(o, node);
    const reads = readers(graph);
    const gone = new Set<Node>();
    const renamed = new Map<string, string>();
    for (const max of nodes) {
      if (max.opType !== 'Max' || max.input?.length !== 2) continue;
      const [x, floor] = max.input as [string, string];
      const sub = producer.get(floor);
      const reduce = sub?.opType === 'Sub' ? producer.get(sub.input![0]!) : undefined;
      if (reduce?.opType !== 'ReduceMax' || reduce.input![0] !== x) continue;
      // Only where the floor feeds this Max alone: otherwise its kernels stay for their other readers.
      if (reads.get(floor) !== 1 || reads.get(reduce.output![0]!) !== 1) continue;
      if ((graph.output ?? []).some((o) => o.name === max.output![0])) continue;
      gone.add(max).add(sub!).add(reduce);
      renamed.set(max.output![0]!, x);
    }
    graph.node = nodes.filter((n) => !gone.has(n));
    for (const node of graph.node) node.input = node.input?.map((i) => renamed.get(i) ?? i);
    // The floor's constant, where nothing else reads it (onnxruntime warns of an unused initializer).
    const left = readers(graph);
    graph.initializer = (graph.initializer ?? []).filter((t) => left.has(t.name!) || !(reads.get(t.name!) ?? 0));
    return gone.size;
  },
};

/**
 * Every MatMulNBits at accuracy_level 0. At level 4 (int8 activations, which the converter sets
 * because it is the CPU's fast path) webgpu runs each product as two programs, one quantizing the
 * activations and one multiplying by DP4A; at 0 it runs one program on float activations, which
 * are also nearer float32's answer.
 */
export const singleProgramProducts: DevicePass = {
  name: 'one program a product',
  apply(graph) {
    let changed = 0;
    for (const node of graph.node ?? []) {
      if (node.opType !== 'MatMulNBits') continue;
      const level = node.attribute?.find((a) => a.name === 'accuracy_level');
      if (!level || Number(level.i) === 0) continue;
      level.i = 0;
      changed++;
    }
    return changed;
  },
};

/**
 * The passes a device-resident graph gets, in order. Measured and left out: each layer's scores
 * over the cache and the new tokens as one product (the cache's keys and values concatenated with
 * the new ones), 5 kernels a layer fewer. On an H100 it saved ~1 ms a step at 1 row but cost 2 ms
 * at 64 rows of m25 and 9-18 ms at 64 rows of m110, where a step is the GPU's, not the host's:
 * webgpu's Concat copies slowly (bench/README.md "GPU: fewer kernels a step").
 */
export const DEVICE_PASSES: readonly DevicePass[] = [dropSoftmaxFloor, singleProgramProducts];
