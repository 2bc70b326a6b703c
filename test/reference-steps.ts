import { expect } from 'vitest';
import ort from 'onnxruntime-node';
import { RefSequences } from '../src/inference/convert/reference.js';
import { headSize, type LlamaCheckpoint } from '../src/inference/convert/llama2c.js';
import { KvSlots, slotStepDone, slotStepFeeds } from '../src/inference/runtime/kv-slots.js';

/**
 * A KV cache's steps checked against run.c's forward pass one sequence at a time (the slot caches'
 * tests): `check` compares a step's logits [rows, vocab] with the reference's and each row's
 * cached positions (`len`) with the reference's; `prime` feeds positions a step's cache starts with;
 * `maxErr` is the largest logit difference seen;
 * `tok` makes `n` token ids from `seed`, none of them 0.
 */
export function referenceSteps(ck: LlamaCheckpoint) {
  const refs = new RefSequences(ck);
  const V = ck.config.vocabSize;
  let maxErr = 0;
  return {
    check(rows: ReadonlyArray<{ seq: number; tokens: number[] }>, logits: Float32Array, len: (seq: number) => number): void {
      rows.forEach((r, b) => {
        const want = refs.feed(r.seq, r.tokens);
        for (let i = 0; i < V; i++) maxErr = Math.max(maxErr, Math.abs(logits[b * V + i]! - want[i]!));
        expect(len(r.seq)).toBe(refs.len(r.seq));
      });
    },
    /** Feeds the reference `tokens` of `seq` unchecked: the positions a step's cache starts with (a copy of another sequence's). */
    prime: (seq: number, tokens: number[]): void => void refs.feed(seq, tokens),
    maxErr: () => maxErr,
    tok: (n: number, seed: number) => Array.from({ length: n }, (_, i) => 1 + ((seed * 7 + i * 13) % (V - 1))),
  };
}

type Step = (rows: Array<{ seq: number; tokens: number[] }>) => Promise<unknown>;

/**
 * The opening the slot caches' tests share, through `step`: three prompts of different lengths in
 * one step (left pads), three decode steps, a fourth prompt alone, then that prompt's second chunk
 * beside two decoding rows in an order of their own. Sequences 1-4 are live after it.
 */
export async function promptsBesideDecoding(step: Step, tok: (n: number, seed: number) => number[]): Promise<void> {
  await step([
    { seq: 1, tokens: tok(5, 1) },
    { seq: 2, tokens: tok(2, 2) },
    { seq: 3, tokens: tok(9, 3) },
  ]);
  for (let i = 0; i < 3; i++) await step([1, 2, 3].map((seq) => ({ seq, tokens: tok(1, seq + i) })));
  await step([{ seq: 4, tokens: tok(6, 4) }]);
  await step([
    { seq: 3, tokens: tok(1, 9) },
    { seq: 4, tokens: tok(4, 5) },
    { seq: 1, tokens: tok(1, 8) },
  ]);
}

/**
 * A slot-cache `graph` of `ck` on one thread with a KvSlots of its shape (the model's context), stepped
 * as worker.ts steps it (slotStepFeeds, a run, slotStepDone), each step checked against the reference
 * (referenceSteps): `step` runs rows, `sl` is the cache, `maxErr` and `tok` as referenceSteps gives them.
 */
export async function checkedSlotSteps(ck: LlamaCheckpoint, graph: Uint8Array, oneTokenGraph?: Uint8Array) {
  const sess = await ort.InferenceSession.create(graph, { intraOpNumThreads: 1 });
  // Steps of one token a row run on `oneTokenGraph` where it is given (runtime/one-token-graph.ts), the others on `graph`.
  const oneToken = oneTokenGraph && (await ort.InferenceSession.create(oneTokenGraph, { intraOpNumThreads: 1 }));
  const c = ck.config;
  const sl = new KvSlots({ layers: c.nLayers, kvHeads: c.nKvHeads, headDim: headSize(c), positionsMax: c.seqLen, emptyCacheFeeds: true });
  const { check, maxErr, tok } = referenceSteps(ck);
  const step = async (rows: Array<{ seq: number; tokens: number[] }>) => {
    const st = slotStepFeeds(sl, rows);
    const on = oneToken && rows.every((r) => r.tokens.length === 1) ? oneToken : sess;
    if (on === oneToken) oneTokenSteps++;
    check(rows, slotStepDone(sl, st, await on.run(st.feeds)), (seq) => sl.len(seq));
  };
  let oneTokenSteps = 0;
  return { sl, step, maxErr, tok, oneTokenSteps: () => oneTokenSteps };
}
