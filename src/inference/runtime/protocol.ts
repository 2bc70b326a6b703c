// Messages between a model's scheduler (main thread) and its worker thread.
// The worker owns the ONNX session, every sequence's KV cache and, once a
// generation's prompt is in, its sampler: a step sends only token ids and
// receives sampled tokens (and last-position logits for scoring), and a
// decode run goes on step after step without waiting for the main thread.

import type { PeerShare } from './peers.js';
import type { Cuts, LogitAdjust, TokenLogprob } from '../engine-api.js';
import type { Grammar } from '../grammar/grammar.js';
import type { LoadedSessions, SessionKind } from './session-choice.js';
import type { ThreadSpin } from './spin.js';
import type { ModelThreadSched } from './thread-policy.js';
import type { StepTokens } from './token-posts.js';
import type { WeightType } from './integer-products.js';
import type { WebgpuValidationMode } from './execution-provider.js';

export interface InitMsg {
  type: 'init';
  modelPath: string;
  /** The model's shared-prefix graph for scoring branches, when it has one (branch.onnx). */
  branchModelPath?: string;
  executionProvider: 'cpu' | 'webgpu' | 'cuda';
  strict: boolean;
  intraOpThreads: number;
  /** Also load a one-thread session of the model graph; steps of a few tokens run on whichever is faster (session-choice.ts). */
  narrowSession: boolean;
  /** Also load a session on every core whose threads spin while a run lasts; steps while few sequences run may go there (session-choice.ts). */
  spinningSession: boolean;
  /** That session runs the graph rewritten for steps of one token a row (one-token-graph.ts), where the graph has the slot form, and then only such steps. */
  oneTokenGraph: boolean;
  /** Also load the graph with its block-quantized products as int8 ones (prefill-graph.ts), where it has any, and with spinningSession that graph on spinning threads too; steps of several rows may go there (session-choice.ts). */
  prefillSession: boolean;
  /** That graph may also load on one thread, for steps while other model workers fill the cores (peers.ts): only a model small enough for one more copy. */
  prefillNarrowSession: boolean;
  /** Also load that graph (or the graph as converted) with its attention in pieces of the queries, for long steps (long-steps.ts): only a model small enough for one more copy. */
  longSession: boolean;
  /** Niceness of the worker's ONNX threads (Linux; 0 leaves them at the process's). */
  nice: number;
  /** Niceness of the worker's own thread (thread-policy.ts workerThreadNice): at most `nice`. */
  workerNice: number;
  /** Their scheduling policy (thread-policy.ts). */
  sched: ModelThreadSched;
  /** How intra-op threads wait between operators (spin.ts). */
  spin: ThreadSpin;
  /** A decode run's fast steps are posted at most this often (token-posts.ts); 0: every step. */
  tokensPostIntervalMs: number;
  /** A slot-cache model's far longer sequences keep their cache apart and step as their own run, on the CPU (kv-pools.ts). */
  kvSplit: boolean;
  /** On a GPU provider, a slot-cache model's KV cache stays on the device between steps (kv-resident.ts). */
  kvOnDevice: boolean;
  /** On webgpu, onnxruntime's validationMode for every session; undefined: its default. */
  webgpuValidationMode?: WebgpuValidationMode;
  /** On webgpu, the process's device lock (device-lock.ts): one worker uses the device at a time. */
  deviceLock?: SharedArrayBuffer;
  /** The graph and its weights on disk: what a second run of a step reads again (kv-pools.ts). */
  modelBytes: number;
  /** The model's context length: no sequence's cache grows past it. */
  positionsMax: number;
  /** This worker's place among the daemon's CPU model workers (peers.ts): each tells the others the sequences it holds. */
  peers?: PeerShare;
  /**
   * Tokens (rows x the longest row) that joins pending together may share one step: the
   * scheduler's prefill budget while sequences decode (options.ts prefillTokensPerStepMax), so
   * the decode rows wait no longer between two steps than for one join of that size.
   */
  joinedStepTokensMax: number;
  /** The most tokens one step holds (options.ts prefillTokensPerIdleStepMax): the longest step the warm-up runs. */
  stepTokensMax: number;
  /** Each token's text mid-document (null: not whole characters), for grammar-constrained sampling. */
  tokenTexts?: Array<string | null>;
  /**
   * Bytes of kept generations (CHAT_PREFIX_CACHE_MB; 0: none kept): a generation that may be kept
   * (SamplerSpec.keep) and ends within them keeps its cache, out of the slots, until a `keep` or
   * `free` of it says what the scheduler does with it (kept-prompts.ts).
   */
  keptBytesMax: number;
  /** Of keptBytesMax, the bytes the worker takes when it loads (kept-arena.ts); the rest as kept generations fill it. */
  keptBytesAtLoad: number;
}

/** Forward passes the worker has run since it started, by session: every core sleeping (wide), one thread (narrow), every core spinning (spinning), the products as int8 ones (prefill), those on spinning threads (prefillSpinning), on one thread (prefillNarrow), that graph with its attention in pieces (long). */
export type ModelPasses = Record<SessionKind, number>;
export const noPasses = (): ModelPasses => ({ wide: 0, narrow: 0, spinning: 0, prefill: 0, prefillSpinning: 0, prefillNarrow: 0, long: 0 });

export interface Arch {
  layers: number;
  kvHeads: number;
  headDim: number;
  kvType: 'float32' | 'float16';
  logitsType: 'float32' | 'float16';
  vocab: number;
  hasPositionIds: boolean;
  /** Branches of one prefix run through the shared-prefix graph (the prefix is not copied per row). */
  sharedPrefix: boolean;
  provider: string;
  /** How the prefill session's int8 products store their weights on this CPU (integer-products.ts); absent without that session. */
  prefillWeights?: WeightType;
  /**
   * Ended generations are kept (InitMsg.keptBytesMax) and a new one may start from a kept one's
   * first positions (StepRow.from): a slot cache on the host only (worker.ts init says why).
   */
  keepsGenerations: boolean;
}

/** The worker's warm-up, timed: decode steps of one row and of a batch, and a short prompt's step (throughput.ts StepPace seeds from it). */
export interface WarmPace {
  decodeStepMs: number;
  /** The decode steps' mean position. */
  decodePosition: number;
  promptTokens: number;
  promptMs: number;
  /** A few decode steps of a batch of rows, each at `position`. */
  batch?: { rows: number; stepMs: number; position: number };
  /** The long-step session's one step, where it loaded (worker.ts warmUpLong; the load's log line shows it). */
  long?: { tokens: number; stepMs: number };
}

/**
 * The one rule for where a generation ends by itself: an end-of-text token, or `budget`
 * (max_tokens) tokens made. The worker stops sampling by it, and the scheduler, reading
 * the same tokens, knows by it which sequences the worker has already let go.
 */
export const endsGeneration = (tok: number, made: number, budget: number, eos: ReadonlySet<number>): boolean => eos.has(tok) || made >= budget;

/** How to sample a generation, given with its last prompt chunk; the worker samples it from then on. */
export interface SamplerSpec {
  temperature: number;
  topP: number;
  seed: number;
  /** Tokens it may generate (max_tokens). */
  budget: number;
  eos: number[];
  /** top_k / min_p; absent: no cut. */
  cuts?: Cuts;
  /** logit_bias and presence / frequency penalties; absent: the raw logits. */
  adjust?: LogitAdjust;
  /** Report each sampled token's logprob and this many alternatives; absent: none. */
  topLogprobs?: number;
  /** Only tokens that keep the output a prefix of this grammar's language (structured output). */
  grammar?: { key: string; grammar: Grammar };
  /** Its cache may be kept when it ends, for its user's later prompts (kept-prompts.ts); absent: freed. */
  keep?: boolean;
}

export interface StepRow {
  seq: number;
  tokens: number[];
  sampler?: SamplerSpec;
  /**
   * A new sequence whose cache starts as the first `tokens.length` positions of kept generation
   * `seq` (kept-prompts.ts), `tokens` being what those positions hold; the row's own tokens follow.
   * Where that generation is not kept after all, the row runs `tokens` first (the step's answer says so).
   */
  from?: { seq: number; tokens: number[] };
}

export type WorkerCommand =
  | InitMsg
  | { type: 'step'; id: number; rows: StepRow[] }
  /** Decode these sampled sequences step after step until each ends (end of text, budget), is freed, an interrupt arrives, or `stepsMax` steps ran. */
  | { type: 'decode'; id: number; seqs: number[]; stepsMax: number }
  /** A prompt step, run inside the decode run in flight (its generations join it) or, if none, as a step; answered like a step. */
  | { type: 'join'; id: number; rows: StepRow[] }
  /**
   * Ends decode run `id` after its current step, whether it runs already or still waits behind
   * other work (an interrupt that came before its run began was once lost there); one for a run
   * that has ended is ignored.
   */
  | { type: 'interrupt'; id: number }
  /** New sequences `to` that continue `from`'s first `at` positions (all of them by default): its KV is shared, not copied. */
  | { type: 'fork'; id: number; from: number; to: number[]; at?: number }
  | { type: 'free'; seqs: number[] }
  /** These sequences generate no more, and their caches stay for later prompts to start from (StepRow.from, Arch.keepsGenerations) until freed. */
  | { type: 'keep'; seqs: number[] }
  /** Waits for the work before it (a decode run stops after its current step), releases the sessions and ends the worker thread (worker.ts endThread). */
  | { type: 'close'; id: number }
  /**
   * Ends the thread at once, from its own JS between two steps (worker.ts endThread): a second
   * signal's exit (code 0) and the tests' simulated crash (code 1, as after an uncaught error).
   */
  | { type: 'exit'; code: number };

export type WorkerEvent =
  | { type: 'ready'; arch: Arch; pace?: WarmPace; sessions: LoadedSessions }
  /** The model could not be loaded: the worker is of no use. */
  | { type: 'init-error'; message: string }
  /** Loaded, but not as asked (a GPU provider fell back to CPU, the branch graph was left out): for the log. */
  | { type: 'warning'; message: string }
  /** Every WORKER_MEMORY_REPORT_MS: the worker's own V8 heap and the memory outside it that V8 knows of (tensors' buffers). */
  | { type: 'memory'; heapUsedBytes: number; externalBytes: number; kvBytes: number }
  /**
   * tokens[b]: the token sampled for row b, -1 for rows without a sampler (their logits are the answer).
   * rowsInStep: the rows of the step this reply's rows ran in, on the first reply of that step; 0 on
   * the other replies of a step that joins shared (worker.ts runJoins), so each step is counted once.
   * missed: the rows (their sequences) that were to start from a kept generation (StepRow.from) and ran its tokens instead.
   */
  | { type: 'step'; id: number; logits: Float32Array; tokens: Int32Array; kvBytes: number; passes: ModelPasses; logprobs?: Array<TokenLogprob | null>; rowsInStep: number; missed?: number[] }
  /** Steps of a decode run, in order: one, or a few fast ones held together (token-posts.ts). */
  | { type: 'tokens'; id: number; steps: StepTokens[] }
  | { type: 'decode-done'; id: number; kvBytes: number; passes: ModelPasses }
  | { type: 'done'; id: number }
  | { type: 'error'; id: number; message: string };
