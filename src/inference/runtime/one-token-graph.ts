import onnxProto from 'onnx-proto';
import type { onnx as P } from 'onnx-proto';
import { oneTokenAttentionCore } from '../convert/onnx-attention.js';
import { attrInt, attrInts, dropUnread, graphIndex, int64s, rewriteSlotAttention } from './slot-attention-rewrite.js';

// The graph of a chat model's steps of one new token a row (a decode step), which the spinning
// session runs (session-choice.ts): the slot-cache graph with each layer's attention in
// onnx-attention.ts oneTokenAttentionCore, and the moves of heads around it as reshapes. A
// decode step at one row is mostly nodes of a few microseconds each (m25 int4 on an Intel machine
// with AMX: 0.54 ms of products in a 0.91 ms step, its attention 0.24 ms of the rest), and a
// token's own key and value, and heads moved across an axis of length 1, need no MatMul and no
// Transpose: 40 nodes fewer at m25, a step 0.92 of the time on two spinning threads
// (bench/README.md, fifty-first session). The same answers to float32's rounding
// (one-token-graph.test.ts); a graph of block-quantized weights rounds its activations to int8,
// where a difference in the last bit can move a rounding, as the other sessions' graphs can.

const { onnx } = onnxProto;
type Tensor = P.ITensorProto;

/**
 * `bytes` (a slot-cache graph as the converter writes it) for steps of one token a row; undefined
 * where the graph's attention is not the slot form. Fed a step of more tokens a row, its answers
 * would be wrong or its reshapes would fail: only one-token steps may run on it.
 */
export function oneTokenGraph(bytes: Uint8Array): Uint8Array | undefined {
  const contexts = new Set<string>();
  const model = rewriteSlotAttention(bytes, (gb, core) => {
    contexts.add(core.ctx);
    oneTokenAttentionCore(gb, core.t, { cacheBias: 'cache_bias', probSplit: core.probSplit }, core.ctx);
  });
  if (!model) return undefined;
  headsAsReshapes(model.graph!, contexts);
  dropUnread(model.graph!);
  return onnx.ModelProto.encode(model).finish();
}

/**
 * The heads' Transposes that swap the token axis (length 1 here) with the heads': the projection's
 * Reshape to [B, S, heads, hd] then [B, heads, S, hd], read by the Split of its heads, becomes one
 * Reshape to [B, heads, 1, hd]; and a context's (`contexts`, the cores' answers, or a Reshape of
 * one for grouped heads) [B, H, S, hd] then [B, S, H, hd] then [B, S, D] one Reshape to [B, 1, D].
 * A Transpose that is not one of these is left as it is.
 */
function headsAsReshapes(g: P.IGraphProto, contexts: Set<string>): void {
  const { producer, consumers, constants } = graphIndex(g);
  const added: Tensor[] = [];
  const shape = (name: string, dims: number[]): string => {
    const t: Tensor = { name: `one-token.shape.${added.length}.${name}`, dataType: onnx.TensorProto.DataType.INT64, dims: [dims.length], rawData: new Uint8Array(BigInt64Array.from(dims.map(BigInt)).buffer) };
    added.push(t);
    return t.name!;
  };
  const isContext = (name: string) => contexts.has(name) || (producer.get(name)?.opType === 'Reshape' && contexts.has(producer.get(name)!.input![0]!));
  for (const t of g.node!) {
    if (t.opType !== 'Transpose' || attrInts(t, 'perm')?.join() !== '0,2,1,3') continue;
    const readers = consumers.get(t.output![0]!) ?? [];
    if (readers.length !== 1) continue;
    const before = producer.get(t.input![0]!);
    const reader = readers[0]!;
    const beforeShape = before?.opType === 'Reshape' ? int64s(constants.get(before.input![1]!)) : undefined;
    const headsSplit = reader.opType === 'Split' && attrInt(reader, 'axis') === 1;
    if (headsSplit && beforeShape?.length === 4 && beforeShape[0] === 0 && beforeShape[1] === 0 && beforeShape[2]! > 0 && beforeShape[3]! > 0 && consumers.get(before!.output![0]!)?.length === 1) {
      // The projection's heads: [B, 1, heads * hd] -> [B, heads, 1, hd] at once.
      before!.input = [before!.input![0]!, shape(before!.output![0]!, [0, beforeShape[2]!, 1, beforeShape[3]!])];
      reader.input = reader.input!.map((i) => (i === t.output![0] ? before!.output![0]! : i));
      continue;
    }
    const afterShape = reader.opType === 'Reshape' ? int64s(constants.get(reader.input![1]!)) : undefined;
    if (isContext(t.input![0]!) && afterShape?.join() === '0,0,-1') {
      // The context: [B, H, 1, hd] -> [B, 1, H * hd] at once.
      reader.input = [t.input![0]!, shape(reader.output![0]!, [0, 1, -1])];
    }
  }
  g.initializer = [...(g.initializer ?? []), ...added];
}
