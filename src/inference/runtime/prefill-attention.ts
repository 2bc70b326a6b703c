import onnxProto from 'onnx-proto';

// The prefill graph's attention over a long cache (prefill-graph.ts calls this on its nodes).
//
// The slot graph's attention (onnx-attention.ts slotAttentionCore) concatenates the cache's
// scores with the new tokens' for one Softmax and splits the probabilities again. That copies the
// whole [new tokens x (cache + new tokens)] square twice, and a chunk over a long cache spends a
// large part of its step there. Such a chunk is a long conversation's next turn, or a long
// prompt's second chunk. Over a long cache this rewrite computes the softmax in two pieces:
// one shared row max, the floor, Exp, and the two sums. It copies nothing, and one layer's
// attention of 128 new tokens over 1,024 took 0.85 of the time. The same form is slower over an
// empty or short cache (a fresh 128-token prompt: 1.18) and even at decode steps
// (bench/attention-forms.ts; bench/README.md "Forms of a long step's attention").
//
// So each layer gets an `If` on the cache's length: two pieces from LONG_CACHE_POSITIONS_MIN
// positions on, the slot graph's own nodes below it. Neither branch holds weights, so the choice
// costs no memory, and an `If` costs ~2 us a run on this machine's two threads.
//
// Both branches compute softmax(max(x, row max - floor)) over the same scores: the answers
// differ by float32 rounding only (prefill-attention.test.ts).

const { onnx } = onnxProto;
type Node = onnxProto.onnx.INodeProto;
type Graph = onnxProto.onnx.IGraphProto;
type Tensor = onnxProto.onnx.ITensorProto;

/**
 * Cache positions from which a step's attention runs in two pieces. At 1,024 positions two pieces
 * took 0.85 of the time at 128 new tokens, and at 512 positions 0.69-0.85 at 512 new tokens. At 96
 * and 512 positions a 16-row decode step took 0.97-1.02, even. An empty cache (a first chunk) must
 * stay on the slot graph's nodes: onnxruntime reduces an empty axis to an empty tensor. Short
 * caches stay there too, where the two pieces' extra nodes are not paid back.
 */
export const LONG_CACHE_POSITIONS_MIN = 256;

/** What the rewrite needs from the graph it works in: its names, its constants, the opset's form of ReduceMax. */
export interface RewriteContext {
  /** A name not used yet, from `what`. */
  fresh: (what: string) => string;
  /** An initializer of the main graph, added once under `name`; returns its full name. */
  constant: (name: string, t: Omit<Tensor, 'name'>) => string;
}

/** One layer's attention as slotAttentionCore writes it, found in the nodes. */
interface Block {
  nodes: Node[];
  cacheScores: string;
  newScores: string;
  floor: string;
  probSplit: string;
  cacheV: string;
  v: string;
  rowMax: Node;
  out: string;
}

const single = (readers: Map<string, Node[]>, name: string, opType: string): Node | undefined => {
  const r = readers.get(name);
  return r?.length === 1 && r[0]!.opType === opType && (r[0]!.domain ?? '') === '' ? r[0] : undefined;
};

const intAttr = (n: Node, name: string): number | undefined => {
  const a = n.attribute?.find((x) => x.name === name);
  return a?.i === undefined || a.i === null ? undefined : Number(a.i);
};

/** The block that starts at `concat`, or undefined where the nodes around it are not slotAttentionCore's. */
function blockAt(concat: Node, readers: Map<string, Node[]>): Block | undefined {
  if (concat.opType !== 'Concat' || (concat.domain ?? '') !== '' || concat.input?.length !== 2 || intAttr(concat, 'axis') !== -1) return undefined;
  const cat = concat.output![0]!;
  const catReaders = readers.get(cat) ?? [];
  const rowMax = catReaders.find((n) => n.opType === 'ReduceMax');
  const max = catReaders.find((n) => n.opType === 'Max');
  if (catReaders.length !== 2 || !rowMax || !max || rowMax.input?.[0] !== cat) return undefined;
  const sub = single(readers, rowMax.output![0]!, 'Sub');
  if (!sub || sub.input?.[0] !== rowMax.output![0] || max.input?.length !== 2 || max.input[0] !== cat || max.input[1] !== sub.output![0]) return undefined;
  if ((readers.get(sub.output![0]!) ?? []).length !== 1) return undefined;
  const softmax = single(readers, max.output![0]!, 'Softmax');
  const split = softmax && single(readers, softmax.output![0]!, 'Split');
  if (!softmax || (intAttr(softmax, 'axis') ?? -1) !== -1 || !split || split.input?.length !== 2 || split.output?.length !== 2 || intAttr(split, 'axis') !== -1) return undefined;
  const [mmCache, mmNew] = split.output.map((o) => single(readers, o, 'MatMul'));
  if (!mmCache || !mmNew || mmCache.input?.[0] !== split.output[0] || mmNew.input?.[0] !== split.output[1]) return undefined;
  const add = single(readers, mmCache.output![0]!, 'Add');
  if (!add || single(readers, mmNew.output![0]!, 'Add') !== add) return undefined;
  return {
    nodes: [concat, rowMax, sub, max, softmax, split, mmCache, mmNew, add],
    cacheScores: concat.input[0]!,
    newScores: concat.input[1]!,
    floor: sub.input![1]!,
    probSplit: split.input[1]!,
    cacheV: mmCache.input![1]!,
    v: mmNew.input![1]!,
    rowMax,
    out: add.output![0]!,
  };
}

const floatOutput = (name: string): onnxProto.onnx.IValueInfoProto => ({ name, type: { tensorType: { elemType: onnx.TensorProto.DataType.FLOAT } } });

/** The two-piece softmax of a block as a subgraph whose output is `out`. */
function twoPieces(b: Block, c: RewriteContext, out: string): Graph {
  const nodes: Node[] = [];
  const op = (opType: string, input: string[], attribute: Node['attribute'] = [], output = c.fresh(opType)): string => {
    nodes.push({ opType, input, output: [output], name: output, attribute });
    return output;
  };
  // The row max as the block's own ReduceMax takes it (axes an attribute or an input, by opset).
  const rowMax = (x: string) => op('ReduceMax', [x, ...(b.rowMax.input ?? []).slice(1)], b.rowMax.attribute ?? []);
  const m = op('Max', [rowMax(b.cacheScores), rowMax(b.newScores)]);
  const low = op('Sub', [m, b.floor]);
  // exp(max(x, m - floor) - m): the slot graph's floor, with no denormal weights (onnx-attention.ts softmaxNoDenormals).
  const weights = (x: string) => op('Exp', [op('Sub', [op('Max', [x, low]), m])]);
  const [wCache, wNew] = [weights(b.cacheScores), weights(b.newScores)];
  const lastAxis = c.constant('last_axis', { dataType: onnx.TensorProto.DataType.INT64, dims: [1], rawData: new Uint8Array(BigInt64Array.of(-1n).buffer) });
  const keep = [{ name: 'keepdims', type: onnx.AttributeProto.AttributeType.INT, i: 1 }];
  const sum = op('Add', [op('ReduceSum', [wCache, lastAxis], keep), op('ReduceSum', [wNew, lastAxis], keep)]);
  const weighted = op('Add', [op('MatMul', [wCache, b.cacheV]), op('MatMul', [wNew, b.v])]);
  op('Div', [weighted, sum], [], out);
  return { name: c.fresh('two_pieces'), node: nodes, output: [floatOutput(out)] };
}

/**
 * Puts each slot attention block of `nodes` under an `If` on its cache's length (see above), in
 * place; returns how many. Nodes outside the blocks are left as they are.
 */
export function longCacheAttention(nodes: Node[], c: RewriteContext): number {
  const readers = new Map<string, Node[]>();
  for (const n of nodes) for (const i of n.input ?? []) if (i) readers.set(i, [...(readers.get(i) ?? []), n]);
  const blocks = nodes.map((n) => blockAt(n, readers)).filter((b): b is Block => !!b);
  if (!blocks.length) return 0;
  // One condition for every layer: they share the step's cache (prob_split is [cache, new]).
  const probSplit = blocks[0]!.probSplit;
  if (blocks.some((b) => b.probSplit !== probSplit)) return 0;
  const i64 = (name: string, v: bigint) => c.constant(name, { dataType: onnx.TensorProto.DataType.INT64, dims: [], rawData: new Uint8Array(BigInt64Array.of(v).buffer) });
  const cachePositions = c.fresh('cache_positions');
  const isLong = c.fresh('long_cache');
  const condition: Node[] = [
    { opType: 'Gather', input: [probSplit, i64('zero', 0n)], output: [cachePositions], name: cachePositions, attribute: [{ name: 'axis', type: onnx.AttributeProto.AttributeType.INT, i: 0 }] },
    { opType: 'GreaterOrEqual', input: [cachePositions, i64('long_cache_positions_min', BigInt(LONG_CACHE_POSITIONS_MIN))], output: [isLong], name: isLong },
  ];
  const replaced = new Map<Node, Node>();
  const dropped = new Set<Node>();
  for (const b of blocks) {
    const add = b.nodes[b.nodes.length - 1]!;
    const shortOut = c.fresh('short_cache_context');
    const short: Graph = { name: c.fresh('slot_attention'), node: b.nodes.map((n) => (n === add ? { ...n, output: [shortOut] } : n)), output: [floatOutput(shortOut)] };
    const attrs = [
      { name: 'then_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: twoPieces(b, c, c.fresh('long_cache_context')) },
      { name: 'else_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: short },
    ];
    // In the place of the block's last node: everything it reads is made before it.
    replaced.set(add, { opType: 'If', input: [isLong], output: [b.out], name: c.fresh('If'), attribute: attrs });
    for (const n of b.nodes) if (n !== add) dropped.add(n);
  }
  const rewritten = nodes.filter((n) => !dropped.has(n)).map((n) => replaced.get(n) ?? n);
  nodes.splice(0, nodes.length, ...condition, ...rewritten);
  return blocks.length;
}
