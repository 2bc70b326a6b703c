import onnxProto from 'onnx-proto';
import { causalChunksAttention } from '../convert/onnx-attention.js';
import { rewriteSlotAttention } from './slot-attention-rewrite.js';

// The graph a model's long steps run on (session-choice.ts `long`): the prefill graph with each
// layer's attention over the slot cache in causal pieces of the queries (onnx-attention.ts
// causalChunksAttention). A 1,000-token prompt of m25 int4 on an empty cache took 0.56-0.80 of the
// prefill graph's time in a step alone (bench/README.md "Long prompts' attention in pieces"); at
// 640 tokens the two forms ran even, and below that the pieces' nodes cost more than they save, so
// the prefill graph keeps the one-piece form for the steps it runs.

/**
 * Query pieces per layer: at 1,000 tokens two and four ran even (0.795 and 0.795 of one piece in
 * one run, 0.603 and 0.564 in a slower one), four keeps a 1,024-token step's score tensor at
 * m25's 8 MB; more adds nodes a step runs for nothing at the shorter long steps.
 */
export const LONG_STEP_QUERY_CHUNKS = 4;

/**
 * `bytes` with every layer's slot-cache attention (onnx-attention.ts slotAttentionCore, as the
 * converter writes it, grouped queries too) in LONG_STEP_QUERY_CHUNKS causal pieces; undefined
 * where the graph has no such attention, or where one of its Softmax nodes is not one (all or
 * nothing).
 */
export function longStepGraph(bytes: Uint8Array): Uint8Array | undefined {
  const model = rewriteSlotAttention(bytes, (gb, core) => causalChunksAttention(gb, core.t, { cacheBias: 'cache_bias', newBias: 'new_bias' }, LONG_STEP_QUERY_CHUNKS, core.ctx, core.groups));
  return model && onnxProto.onnx.ModelProto.encode(model).finish();
}
