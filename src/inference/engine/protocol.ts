// Messages between a model's scheduler (main thread) and its worker thread.
// The worker owns the ONNX session and every sequence's KV cache, so a step
// carries only token ids in and the logits of the positions asked for out.

import type { ExecutionProvider } from './options.js';

/** Facts about a model read from its ONNX graph (never hard-coded). */
export interface Arch {
  layers: number;
  kvHeads: number;
  headDim: number;
  kvType: 'float32' | 'float16';
  logitsType: 'float32' | 'float16';
  vocab: number;
  hasPositionIds: boolean;
  /** False for exports whose causal mask only handles an empty past or one new token (onnxruntime-genai builder); the scheduler then continues sequences one token per step. */
  multiTokenWithPast: boolean;
  /** The provider the session actually runs on. */
  provider: ExecutionProvider;
}

export interface InitMsg {
  type: 'init';
  modelPath: string;
  executionProvider: ExecutionProvider;
  executionProviderStrict: boolean;
  intraOpThreads: number;
  kvPadWasteRatioMax: number;
}

/** What a step row wants back for its last new position. */
export const WANT_NONE = 0;
export const WANT_LOGITS = 1;
export const WANT_LOGPROBS = 2;

/**
 * One forward pass. Row i runs `counts[i]` new tokens (taken in order from
 * `tokens`) after the cached KV of sequence `seqs[i]` (empty for a new id).
 */
export interface StepMsg {
  type: 'step';
  id: number;
  seqs: Int32Array;
  counts: Int32Array;
  tokens: Int32Array;
  want: Uint8Array;
}

export type ToWorker =
  | InitMsg
  | StepMsg
  /** Sequences `to` start with a copy of `from`'s KV (shared, copy-on-use). */
  | { type: 'fork'; from: number; to: number[] }
  | { type: 'free'; seqs: number[] }
  | { type: 'close'; id: number };

export interface StepTimings {
  /** ms spent building inputs (KV batch assembly included). */
  prepMs: number;
  /** ms inside session.run. */
  runMs: number;
  /** ms spent on outputs (logits, KV bookkeeping). */
  postMs: number;
  /** How the past KV was produced: reused as is, rebuilt with copies, or a side batch. */
  mode: 'reuse' | 'rebuild' | 'side' | 'fresh';
}

export type FromWorker =
  | { type: 'ready'; arch: Arch; warning?: string }
  | { type: 'init-error'; message: string }
  /** `logits`: one row of `vocab` floats per row with want != 0, in row order. */
  | { type: 'step'; id: number; logits: Float32Array; kvBytes: number; timings: StepTimings }
  | { type: 'closed'; id: number }
  | { type: 'error'; id: number; message: string };
