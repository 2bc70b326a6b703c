// Every limit of the engine, named with its unit, with the reason for its default.

export type ExecutionProvider = 'cpu' | 'webgpu' | 'cuda';

/** How a model's ONNX session is run (one worker thread per model). */
export interface RuntimeOptions {
  /** Execution provider asked for; a GPU one that fails to start falls back to cpu unless strict. */
  executionProvider: ExecutionProvider;
  /** Refuse to load a model (instead of falling back to cpu) when the asked provider fails. */
  executionProviderStrict: boolean;
  /** ORT intra-op threads per session. 1: on small models a thread pool's hand-offs cost more than the
   *  parallel work saves (measured on 2 cores: 1 thread 2.2k tok/s vs 2 threads 0.7k tok/s at batch 1),
   *  and the main thread needs the other core for scheduling, sampling and HTTP. */
  intraOpThreads: number;
}

/** Limits of one model's scheduler. */
export interface SchedulerOptions {
  /** Sequences holding a batch slot (decode rows per step). 64: raw decode tokens/s still grows up to
   *  64 rows on a 2-core CPU (8.8k at 16, 11.6k at 64 on stories260K); beyond that latency per step
   *  grows linearly with no throughput gain. */
  batchSizeMax: number;
  /** Requests waiting for a slot before new ones are refused with 429 'overloaded'. 256 = 4 full
   *  batches: a few seconds of work, long enough to absorb bursts, short enough that a waiting
   *  client still gets an answer before its own timeout. */
  queueDepthMax: number;
  /** Token positions (rows x padded width) in one prefill step. 512: on stories260K-sized models a
   *  step of 512 positions takes a few ms, so a new prompt never stalls running streams for more
   *  than that, while a typical prompt still prefills in one step. */
  prefillTokensPerStepMax: number;
  /** Generated tokens a stream may hold unread before its sequence is paused (skipped in steps,
   *  KV kept). 64: a few hundred bytes of text per stream; a reader that stopped reading costs no
   *  compute and no unbounded memory, while a normal reader never waits on it. */
  pendingTokensMax: number;
  /** Retry-After given with a full-queue 429, in ms. 1000: about the time a full batch needs to free slots. */
  overloadRetryAfterMs: number;
  /** Padding (left pads and holes) allowed in the resident batch KV, as a fraction of its positions,
   *  before a batch change compacts it instead of copying it as it is. 0.25: compaction copies every
   *  row position by position, so it is worth doing only when a quarter of each step's attention
   *  work is spent on pads. */
  kvPadWasteRatioMax: number;
}

export type EngineOptions = RuntimeOptions & SchedulerOptions;

export const defaultRuntimeOptions: RuntimeOptions = {
  executionProvider: 'cpu',
  executionProviderStrict: false,
  intraOpThreads: 1,
};

export const defaultSchedulerOptions: SchedulerOptions = {
  batchSizeMax: 64,
  queueDepthMax: 256,
  prefillTokensPerStepMax: 512,
  pendingTokensMax: 64,
  overloadRetryAfterMs: 1000,
  kvPadWasteRatioMax: 0.25,
};

export const defaultEngineOptions: EngineOptions = { ...defaultRuntimeOptions, ...defaultSchedulerOptions };
