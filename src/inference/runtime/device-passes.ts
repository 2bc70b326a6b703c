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

/** An int64 initializer. */
function i64(name: string, values: number[]): onnxProto.onnx.ITensorProto {
  const raw = new Uint8Array(BigInt64Array.from(values.map(BigInt)).buffer);
  return { name, dataType: onnxProto.onnx.TensorProto.DataType.INT64, dims: [values.length], rawData: raw };
}

/**
 * Each layer's attention over the cache and the new tokens as one score product (onnx-attention.ts
 * slotCacheAttention, after the softmax floor is out). The CPU graph scores the cache and the new
 * tokens apart, so that no step copies a row's cache into a present beside its new keys: 12
 * kernels a layer. On the device that copy is a fraction of a millisecond even at 64 rows, and the
 * host's kernels are what a step waits for, so here the new keys and values are appended to the
 * cache's (Concat) and one MatMul, one Add of a bias over both (built once a step), one Softmax and
 * one MatMul do the rest: 7 kernels a layer.
 */
export const oneScoreProduct: DevicePass = {
  name: 'one score product a layer',
  apply(graph) {
    const nodes = graph.node ?? [];
    const producer = new Map<string, Node>();
    for (const node of nodes) for (const o of node.output ?? []) producer.set(o, node);
    const reads = readers(graph);
    const made = (name: string, opType: string) => {
      const n = producer.get(name);
      return n?.opType === opType ? n : undefined;
    };
    /** The node behind `name` when `opType` makes it and only the pattern reads it. */
    const inner = (name: string | undefined, opType: string) => (name !== undefined && reads.get(name) === 1 ? made(name, opType) : undefined);
    const transposedLast = (n: Node | undefined) => {
      const perm = n?.attribute?.find((a) => a.name === 'perm')?.ints?.map(Number);
      return perm?.join() === '0,1,3,2';
    };
    const gone = new Set<Node>();
    const added: Node[] = [];
    const biases = new Map<string, string>();
    const inits: onnxProto.onnx.ITensorProto[] = [];
    let at = 0;
    const fresh = (what: string) => `cloudgate.device.${what}.${at++}`;
    const node = (opType: string, input: string[], output: string, attribute: onnxProto.onnx.IAttributeProto[] = []): string => {
      added.push({ opType, input, output: [output], name: output, attribute });
      return output;
    };
    const intAttr = (name: string, i: number) => ({ name, type: onnxProto.onnx.AttributeProto.AttributeType.INT, i });
    const permAttr = { name: 'perm', type: onnxProto.onnx.AttributeProto.AttributeType.INTS, ints: [0, 1, 3, 2] };
    // [B, 1, 1, C] cache bias beside the [B, 1, gS, S] new one: once a step for every layer.
    const biasOf = (cacheBias: string, newBias: string) => {
      const key = `${cacheBias}|${newBias}`;
      if (!biases.has(key)) {
        const rows = node('Shape', [newBias], fresh('bias_rows'), [intAttr('start', 2), intAttr('end', 3)]);
        const ones = fresh('ones_two');
        const one = fresh('one');
        inits.push(i64(ones, [1, 1]), i64(one, [1]));
        const shape = node('Concat', [ones, rows, one], fresh('bias_shape'), [intAttr('axis', 0)]);
        const wide = node('Expand', [cacheBias, shape], fresh('cache_bias_rows'));
        biases.set(key, node('Concat', [wide, newBias], fresh('bias'), [intAttr('axis', -1)]));
      }
      return biases.get(key)!;
    };
    for (const softmax of nodes) {
      if (softmax.opType !== 'Softmax') continue;
      const concat = inner(softmax.input?.[0], 'Concat');
      const probs = softmax.output![0]!;
      const split = (nodes.find((n) => n.opType === 'Split' && n.input?.[0] === probs && n.output?.length === 2) as Node | undefined);
      if (!concat || concat.input?.length !== 2 || reads.get(probs) !== 1 || !split) continue;
      const [addCache, addNew] = concat.input.map((i) => inner(i, 'Add'));
      const [scoresCache, scoresNew] = [addCache, addNew].map((a) => inner(a?.input?.[0], 'MatMul'));
      const [tCache, tNew] = [scoresCache, scoresNew].map((m) => inner(m?.input?.[1], 'Transpose'));
      if (!addCache || !addNew || !scoresCache || !scoresNew || !tCache || !tNew || !transposedLast(tCache) || !transposedLast(tNew)) continue;
      const q = scoresCache.input![0]!;
      if (scoresNew.input![0] !== q) continue;
      const [pCache, pNew] = split.output as [string, string];
      const readersOf = (v: string) => nodes.filter((n) => n.input?.includes(v));
      const [ctxCache, ctxNew] = [pCache, pNew].map((p) => (reads.get(p) === 1 ? readersOf(p).find((n) => n.opType === 'MatMul' && n.input![0] === p) : undefined));
      const sum = ctxCache && reads.get(ctxCache.output![0]!) === 1 ? readersOf(ctxCache.output![0]!).find((n) => n.opType === 'Add') : undefined;
      if (!ctxCache || !ctxNew || !sum || !sum.input!.includes(ctxNew.output![0]!) || reads.get(ctxNew.output![0]!) !== 1) continue;
      const [cacheK, k, cacheV, v] = [tCache.input![0]!, tNew.input![0]!, ctxCache.input![1]!, ctxNew.input![1]!];
      const keys = node('Concat', [cacheK, k], fresh('keys'), [intAttr('axis', 2)]);
      const scores = node('MatMul', [q, node('Transpose', [keys], fresh('keys_t'), [permAttr])], fresh('scores'));
      const p = node('Softmax', [node('Add', [scores, biasOf(addCache.input![1]!, addNew.input![1]!)], fresh('biased'))], fresh('probs'), softmax.attribute ?? []);
      node('MatMul', [p, node('Concat', [cacheV, v], fresh('values'), [intAttr('axis', 2)])], sum.output![0]!);
      for (const n of [softmax, concat, split, addCache, addNew, scoresCache, scoresNew, tCache, tNew, ctxCache, ctxNew, sum]) gone.add(n);
    }
    if (!gone.size) return 0;
    // onnxruntime orders the nodes itself (the resident graph's cache nodes already come last).
    graph.node = [...nodes.filter((n) => !gone.has(n)), ...added];
    graph.initializer = [...(graph.initializer ?? []), ...inits];
    return gone.size;
  },
};

/** The passes a device-resident graph gets, in order (the score product's pattern is the one without the floor). */
export const DEVICE_PASSES: readonly DevicePass[] = [dropSoftmaxFloor, oneScoreProduct, singleProgramProducts];
