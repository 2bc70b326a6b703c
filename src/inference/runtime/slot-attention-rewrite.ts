import onnxProto from 'onnx-proto';
import type { onnx as P } from 'onnx-proto';
import { GraphBuilder } from '../convert/onnx-graph.js';

// The rewrites of a slot-cache graph's attention (onnx-attention.ts slotAttentionCore, as the
// converter writes it): each layer's core found by its nodes, and put back in another form written
// by the converter's own builder. long-steps.ts writes it in causal pieces of the queries,
// one-token-graph.ts for steps of one token a row.

const onnx = onnxProto.onnx;

type Node = P.INodeProto;

/**
 * `bytes` decoded, with every layer's slot-cache attention core replaced by what `write` puts in
 * the builder it is given, which must answer the core's context under `core.ctx` (the name the rest
 * of the graph reads); `layer` counts the cores in the graph's order. Nodes and constants nothing
 * reads any more are dropped. Undefined where the graph has no such attention, or where one of its
 * Softmax nodes is not one (all or nothing).
 */
export function rewriteSlotAttention(bytes: Uint8Array, write: (gb: GraphBuilder, core: Core, layer: number) => void): P.ModelProto | undefined {
  const model = onnx.ModelProto.decode(bytes);
  const g = model.graph;
  if (!g?.node?.length) return undefined;
  const inputs = new Set((g.input ?? []).map((i) => i.name!));
  if (!inputs.has('cache_bias') || !inputs.has('new_bias')) return undefined;
  const { producer, consumers, constants } = graphIndex(g);
  const softmaxes = g.node.filter((n) => n.opType === 'Softmax');
  if (!softmaxes.length) return undefined;
  const replaced = new Map<Node, Node[]>(); // each layer's last node -> its new nodes
  const removed = new Set<Node>();
  const added: P.ITensorProto[] = [];
  for (const [layer, softmax] of softmaxes.entries()) {
    const found = matchCore(softmax, producer, consumers, inputs, constants);
    if (!found) return undefined;
    const gb = new GraphBuilder();
    write(gb, found, layer);
    gb.output(found.ctx, 'float32', []);
    // Through the builder's own encoding: its nodes and constants as protobuf, renamed apart from the graph's.
    const piece = onnx.ModelProto.decode(gb.encode({ graphName: 'piece', opset: 17, producer: 'cloudgate' }).model).graph!;
    const own = new Set([...piece.node!.flatMap((n) => n.output!), ...piece.initializer!.map((t) => t.name!)]);
    own.delete(found.ctx);
    const name = (x: string) => (own.has(x) ? `rewrite.${layer}.${x}` : x);
    replaced.set(
      found.last,
      piece.node!.map((n) => ({ ...n, name: `rewrite.${layer}.${n.name}`, input: n.input!.map(name), output: n.output!.map(name) })),
    );
    for (const t of piece.initializer!) added.push({ ...t, name: name(t.name!) });
    for (const n of found.nodes) removed.add(n);
  }
  // Each layer's new nodes where its core's last node was: everything they read is made before it,
  // and everything that reads their answer after it.
  g.node = g.node.flatMap((n) => replaced.get(n) ?? (removed.has(n) ? [] : [n]));
  g.initializer = [...(g.initializer ?? []), ...added];
  dropUnread(g);
  return model;
}

/** Who makes each value of `g`, who reads it, and its constants by name. */
export function graphIndex(g: P.IGraphProto): { producer: Map<string, Node>; consumers: Map<string, Node[]>; constants: Map<string, P.ITensorProto> } {
  const producer = new Map<string, Node>();
  const consumers = new Map<string, Node[]>();
  for (const n of g.node ?? []) {
    for (const o of n.output ?? []) producer.set(o, n);
    for (const i of n.input ?? []) {
      const readers = consumers.get(i);
      if (readers) readers.push(n);
      else consumers.set(i, [n]);
    }
  }
  return { producer, consumers, constants: new Map((g.initializer ?? []).map((t) => [t.name!, t])) };
}

/** An int64 constant's values (raw or typed), or undefined where `t` is not one. */
export function int64s(t: P.ITensorProto | undefined): number[] | undefined {
  if (t?.dataType !== onnx.TensorProto.DataType.INT64) return undefined;
  if (t.rawData?.length) return Array.from(new BigInt64Array(Uint8Array.from(t.rawData).buffer), Number);
  return t.int64Data?.map(Number);
}

/** One layer's slot attention core as a graph holds it: what it reads, and the nodes it is. */
export interface Core {
  t: { q: string; k: string; v: string; cacheK: string; cacheV: string };
  /** Query heads a key head: the graph's `new_bias` is tiled this many times for the scores (onnx-writer.ts). */
  groups: number;
  /** The context's name (the core's last Add), which the rest of the graph reads. */
  ctx: string;
  /** The probabilities' split sizes, [capacity, S] (the graph computes them once a run). */
  probSplit: string;
  last: Node;
  nodes: Node[];
}

/**
 * slotAttentionCore's 15 nodes around `softmax`: Transpose and MatMul of the cache's keys and of the
 * new ones, their biases added, Concat, the softmax floor (ReduceMax, Sub, Max), Softmax, Split, two
 * MatMuls with the cache's values and the new ones, Add. Undefined unless every node is there and
 * nothing but the core reads what it makes (the context aside).
 */
function matchCore(softmax: Node, producer: Map<string, Node>, consumers: Map<string, Node[]>, inputs: Set<string>, constants: Map<string, P.ITensorProto>): Core | undefined {
  const from = (n: Node | undefined, i: number, op: string): Node | undefined => {
    const p = n && producer.get(n.input?.[i] ?? '');
    return p?.opType === op ? p : undefined;
  };
  const only = (name: string | undefined, op: string): Node | undefined => {
    const c = consumers.get(name ?? '') ?? [];
    return c.length === 1 && c[0]!.opType === op ? c[0] : undefined;
  };
  const max = from(softmax, 0, 'Max');
  const cat = from(max, 0, 'Concat');
  const floor = from(max, 1, 'Sub');
  const reduce = from(floor, 0, 'ReduceMax');
  const [cacheScores, newScores] = [from(cat, 0, 'Add'), from(cat, 1, 'Add')];
  const [cacheMm, newMm] = [from(cacheScores, 0, 'MatMul'), from(newScores, 0, 'MatMul')];
  const [cacheKT, newKT] = [from(cacheMm, 1, 'Transpose'), from(newMm, 1, 'Transpose')];
  const split = only(softmax.output?.[0], 'Split');
  const [cachePv, newPv] = [only(split?.output?.[0], 'MatMul'), only(split?.output?.[1], 'MatMul')];
  const sum = only(cachePv?.output?.[0], 'Add');
  if (!max || !cat || !floor || !reduce || !cacheScores || !newScores || !cacheMm || !newMm || !cacheKT || !newKT || !split || !cachePv || !newPv || !sum) return undefined;
  if (reduce.input?.[0] !== cat.output?.[0] || cat.input?.length !== 2 || split.output?.length !== 2 || !sum.input?.includes(newPv.output![0]!)) return undefined;
  // Over the last axis, the keys transposed: the converter's attributes (onnx-attention.ts).
  const lastAxis = [cat, softmax, split].every((n) => attrInt(n, 'axis') === -1);
  const keysT = [cacheKT, newKT].every((n) => attrInts(n, 'perm')?.join() === '0,1,3,2');
  if (!lastAxis || !keysT) return undefined;
  if (cacheScores.input?.[1] !== 'cache_bias') return undefined;
  const groups = groupsOf(newScores.input?.[1], producer, constants);
  const q = cacheMm.input![0]!;
  const [cacheK, cacheV] = [cacheKT.input![0]!, cachePv.input![1]!];
  if (groups === undefined || newMm.input![0] !== q || !inputs.has(cacheK) || !inputs.has(cacheV)) return undefined;
  // The queries come from the rotation: as they are, or for grouped heads as [B, KV, g*S, hd] (a Reshape).
  const rotated = groups === 1 ? producer.get(q) : producer.get(q)?.opType === 'Reshape' ? producer.get(producer.get(q)!.input?.[0] ?? '') : undefined;
  if (rotated?.opType !== 'RotaryEmbedding') return undefined;
  const nodes = [cacheKT, cacheMm, cacheScores, newKT, newMm, newScores, cat, reduce, floor, max, softmax, split, cachePv, newPv, sum];
  const inCore = new Set(nodes);
  const ctx = sum.output![0]!;
  for (const n of nodes) for (const o of n.output ?? []) if (o !== ctx && (consumers.get(o) ?? []).some((c) => !inCore.has(c))) return undefined;
  return { t: { q, k: newKT.input![0]!, v: newPv.input![1]!, cacheK, cacheV }, groups, ctx, probSplit: split.input![1]!, last: sum, nodes };
}

const attrOf = (n: Node, name: string) => n.attribute?.find((a) => a.name === name);
export const attrInt = (n: Node, name: string): number | undefined => {
  const a = attrOf(n, name);
  return a?.i === undefined || a.i === null ? undefined : Number(a.i);
};
export const attrInts = (n: Node, name: string): number[] | undefined => attrOf(n, name)?.ints?.map(Number);

/** Query heads a key head, from the bias the new tokens' scores add: `new_bias` itself (1), or it tiled [1, 1, g, 1] (g); undefined otherwise. */
function groupsOf(bias: string | undefined, producer: Map<string, Node>, constants: Map<string, P.ITensorProto>): number | undefined {
  if (bias === 'new_bias') return 1;
  const tile = producer.get(bias ?? '');
  if (tile?.opType !== 'Tile' || tile.input?.[0] !== 'new_bias') return undefined;
  const r = int64s(constants.get(tile.input[1] ?? ''));
  return r?.length === 4 && r[0] === 1 && r[1] === 1 && r[3] === 1 && r[2]! > 1 ? r[2] : undefined;
}

/** Drops the nodes and constants nothing reads any more (the cores' shared floor, the probabilities' split sizes). */
export function dropUnread(g: P.IGraphProto): void {
  const outputs = new Set((g.output ?? []).map((o) => o.name!));
  for (let changed = true; changed; ) {
    const read = new Set(g.node!.flatMap((n) => n.input ?? []));
    const before = g.node!.length;
    g.node = g.node!.filter((n) => (n.output ?? []).some((o) => read.has(o) || outputs.has(o)));
    changed = g.node.length !== before;
  }
  const read = new Set(g.node!.flatMap((n) => n.input ?? []));
  g.initializer = (g.initializer ?? []).filter((t) => read.has(t.name!));
}
