import { counter, gauge, histogram, HotCounter, HotHistogram, REQUEST_SECONDS_BUCKETS } from '../../metrics.js';

// Engine metrics, served on the inference port under vLLM's names and its
// `model_name` label where the meaning is the same (docs/metrics.md), so
// vLLM's Grafana dashboards and the Gateway API Inference Extension's endpoint
// picker read this daemon as they read vLLM. The scheduler calls these with
// `{model}`; the label is renamed here, in one place.

/** `replica`: which of a model's workers (replicas.ts) sets a gauge; series stay one a model. */
type ModelLabels = { model: string; replica?: number };
const L = (l: ModelLabels) => ({ model_name: l.model });

/**
 * A gauge's latest value from each replica of a model, folded into the model's one series
 * (a dashboard's query reads one model as before): requests and bytes add up, a wait is the
 * shortest (a new request goes to the least loaded replica), a model is down when all are.
 */
class PerReplica {
  private readonly byModel = new Map<string, number[]>();
  constructor(private readonly fold: (values: number[]) => number) {}

  /** Records replica `l.replica`'s value; returns the model's folded one. */
  set(l: ModelLabels, v: number): number {
    let values = this.byModel.get(l.model);
    if (!values) this.byModel.set(l.model, (values = []));
    values[l.replica ?? 0] = v;
    return this.fold(values);
  }
}
// `values` is indexed by replica and may have holes (a replica that has not reported yet):
// reduce skips holes, so each fold, the mean's count included, reads the replicas that reported.
const sum = (vs: number[]) => vs.reduce((a, b) => a + b, 0);
const least = (vs: number[]) => vs.reduce((a, b) => Math.min(a, b), Infinity);
const mean = (vs: number[]) => sum(vs) / vs.reduce((n) => n + 1, 0);
const folds = {
  running: new PerReplica(sum),
  waiting: new PerReplica(sum),
  kvBytes: new PerReplica(sum),
  heap: new PerReplica(sum),
  external: new PerReplica(sum),
  kvUsage: new PerReplica(mean),
  admissionWait: new PerReplica(least),
  down: new PerReplica(least),
};

/** vLLM's 1-2-5 token-count buckets (build_1_2_5_buckets), up to the longest context served anywhere. */
const TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000, 200_000];
/** First token: a prefill of a cached-model prompt is milliseconds, a queued one under load minutes. */
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
/** Per output token: sub-millisecond steps of a tiny model on a CPU up to a starved batch's seconds. */
const TPOT_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];

const N = ['model_name'] as const;
const running = gauge({ name: 'vllm:num_requests_running', help: 'Requests holding a batch slot (generations and evaluations)', labelNames: N }, 'inference');
const waiting = gauge({ name: 'vllm:num_requests_waiting', help: 'Requests admitted and waiting for a batch slot', labelNames: N }, 'inference');
const kvUsage = gauge({ name: 'vllm:kv_cache_usage_perc', help: 'KV-cache usage, 0 to 1: positions held over batch slots x context length', labelNames: N }, 'inference');
// vLLM's name for the same figure before 0.10; the endpoint picker and older dashboards still read it.
const gpuCacheUsage = gauge({ name: 'vllm:gpu_cache_usage_perc', help: 'KV-cache usage, 0 to 1 (the older name of vllm:kv_cache_usage_perc)', labelNames: N }, 'inference');
const promptTokens = counter({ name: 'vllm:prompt_tokens_total', help: 'Prompt tokens run through the model (prefill), and those of generations taken from a kept cache (as vLLM counts every prompt token)', labelNames: N }, 'inference');
// vLLM's prefix-cache counters, in tokens: here the evaluation prefixes (a request's state) and those joined
// while another request's identical one was still prefilling (scheduler.ts scoreBranches).
const prefixQueries = counter({ name: 'vllm:prefix_cache_queries_total', help: 'Prefix tokens looked up: evaluation states, and chat or completion prompts where kept generations are (CHAT_PREFIX_CACHE_MB)', labelNames: N }, 'inference');
const prefixHits = counter({ name: 'vllm:prefix_cache_hits_total', help: 'Of those, tokens not run again: found prefilling for another request or kept after an earlier one of the same user', labelNames: N }, 'inference');
// Observed a token each: the hot kind (metrics.ts HotMetric), which allocates nothing an observation.
const generationTokens = new HotCounter({ name: 'vllm:generation_tokens_total', help: 'Tokens generated', label: 'model_name' }, 'inference');
const ttft = histogram({ name: 'vllm:time_to_first_token_seconds', help: 'From admission to the engine to the first generated token', labelNames: N, buckets: TTFT_BUCKETS }, 'inference');
const itl = new HotHistogram({ name: 'vllm:inter_token_latency_seconds', help: 'Time between consecutive generated tokens of a sequence', label: 'model_name', buckets: TPOT_BUCKETS }, 'inference');
// vLLM before 0.10 named the per-token figure this; its example dashboard reads it.
const tpotPerToken = new HotHistogram({ name: 'vllm:time_per_output_token_seconds', help: 'Time between consecutive generated tokens (the older name of vllm:inter_token_latency_seconds)', label: 'model_name', buckets: TPOT_BUCKETS }, 'inference');
const e2e = histogram({ name: 'vllm:e2e_request_latency_seconds', help: 'Generation requests, from admission to the engine to their end', labelNames: N, buckets: REQUEST_SECONDS_BUCKETS }, 'inference');
const queue = histogram({ name: 'vllm:request_queue_time_seconds', help: 'Time a generation request waited for a batch slot', labelNames: N, buckets: REQUEST_SECONDS_BUCKETS }, 'inference');
const inferenceTime = histogram({ name: 'vllm:request_inference_time_seconds', help: 'Time a generation request held a batch slot (prefill plus decode)', labelNames: N, buckets: REQUEST_SECONDS_BUCKETS }, 'inference');
const prefill = histogram({ name: 'vllm:request_prefill_time_seconds', help: 'From a slot to the first token (the prompt\'s prefill)', labelNames: N, buckets: REQUEST_SECONDS_BUCKETS }, 'inference');
const decode = histogram({ name: 'vllm:request_decode_time_seconds', help: 'From the first token to the last', labelNames: N, buckets: REQUEST_SECONDS_BUCKETS }, 'inference');
const tpotPerRequest = histogram({ name: 'vllm:request_time_per_output_token_seconds', help: 'A request\'s decode time over its output tokens after the first', labelNames: N, buckets: TPOT_BUCKETS }, 'inference');
const promptLen = histogram({ name: 'vllm:request_prompt_tokens', help: 'Prompt length of finished generation requests, in tokens', labelNames: N, buckets: TOKEN_BUCKETS }, 'inference');
const genLen = histogram({ name: 'vllm:request_generation_tokens', help: 'Tokens generated by finished generation requests', labelNames: N, buckets: TOKEN_BUCKETS }, 'inference');
const finished = counter({ name: 'vllm:request_success_total', help: 'Finished generation requests by finish reason (stop, length, abort, error)', labelNames: ['model_name', 'finished_reason'] }, 'inference');
const passes = counter({ name: 'cloudgate_engine_forward_passes_total', help: "Forward passes of a model's graph by session: threads=\"all\" (every core, sleeping between operators), \"one\" (its one-thread session for narrow steps), \"all_spinning\" (every core, spinning while a step runs, while few sequences run) \"all_prefill\" (every core, sleeping, the graph whose block-quantized products are int8 ones, for steps of several rows) \"all_prefill_spinning\" (that graph spinning, for short steps while few sequences run) \"one_prefill\" (that graph on one thread, for steps while other model workers' steps fill the cores) or \"all_long\" (every core, sleeping, that graph with its attention in pieces of the queries, for long prompts' steps)", labelNames: ['model_name', 'threads'] }, 'inference');
const batchSize = histogram({ name: 'cloudgate_engine_batch_size', help: 'Rows in one forward pass, by phase', labelNames: ['model_name', 'phase'], buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256] }, 'inference');
const workerRestarts = counter({ name: 'cloudgate_engine_worker_restarts_total', help: 'Model workers restarted after they died (their requests in flight failed)', labelNames: N }, 'inference');
const workerHeap = gauge({ name: 'cloudgate_engine_worker_heap_used_bytes', help: "A model worker thread's V8 heap in use (its JavaScript objects), reported every 10 s", labelNames: N }, 'inference');
const workerExternal = gauge({ name: 'cloudgate_engine_worker_external_bytes', help: 'Memory a model worker holds outside its V8 heap that V8 knows of (ArrayBuffers: tensors, logits); ONNX Runtime\'s own allocations are not in it', labelNames: N }, 'inference');
const modelDown = gauge({ name: 'cloudgate_engine_model_down', help: '1 while a model is down: its worker died more often than the restart budget allows', labelNames: N }, 'inference');
const admissionWait = gauge({ name: 'cloudgate_engine_admission_wait_seconds', help: 'The wait a request arriving now would have for a batch slot, as admission estimated it last', labelNames: N }, 'inference');
// Where a model runs: a GPU provider that fell back to the CPU shows here, not only in the log.
const modelInfo = gauge({ name: 'cloudgate_engine_model_info', help: 'Always 1: the execution provider a model runs on (cpu, webgpu, cuda) and the weight variant served (fp32, fp16, int8, q4, q4f16)', labelNames: ['model_name', 'provider', 'dtype'] }, 'inference');
const infoOf = new Map<string, { model_name: string; provider: string; dtype: string }>();
const kvBytes = gauge({ name: 'cloudgate_engine_kv_cache_bytes', help: 'Bytes held by the KV caches: live sequences, an evaluation model\'s kept states (EVAL_PREFIX_CACHE_MB), the memory a chat model took at load for its kept generations (CHAT_PREFIX_CACHE_MB) and its slot buffers for up to 10 s after its last sequence', labelNames: N }, 'inference');

export const engineMetrics = {
  admissionWait: { set: (l: ModelLabels, s: number) => admissionWait.set(L(l), folds.admissionWait.set(l, s)) },
  workerRestarts: { inc: (l: ModelLabels) => workerRestarts.inc(L(l)) },
  workerMemory: { set: (l: ModelLabels, heapUsedBytes: number, externalBytes: number) => (workerHeap.set(L(l), folds.heap.set(l, heapUsedBytes)), workerExternal.set(L(l), folds.external.set(l, externalBytes))) },
  modelDown: { set: (l: ModelLabels, down: boolean) => modelDown.set(L(l), folds.down.set(l, down ? 1 : 0)) },
  modelInfo: {
    // One series a model: a model loaded again elsewhere (another provider or variant) replaces its own.
    set: (l: ModelLabels & { provider: string; dtype: string }) => {
      const now = { model_name: l.model, provider: l.provider, dtype: l.dtype };
      const before = infoOf.get(l.model);
      if (before) modelInfo.remove(before);
      modelInfo.set(now, 1);
      infoOf.set(l.model, now);
    },
  },
  running: { set: (l: ModelLabels, v: number) => running.set(L(l), folds.running.set(l, v)) },
  waiting: { set: (l: ModelLabels, v: number) => waiting.set(L(l), folds.waiting.set(l, v)) },
  promptTokens: { inc: (l: ModelLabels, v = 1) => promptTokens.inc(L(l), v) },
  /** Per token, by model name (not ModelLabels): nothing is allocated an observation. */
  generatedTokens: { inc: (model: string, v = 1) => generationTokens.inc(model, v) },
  prefixQueries: { inc: (l: ModelLabels, v: number) => prefixQueries.inc(L(l), v) },
  prefixHits: { inc: (l: ModelLabels, v: number) => prefixHits.inc(L(l), v) },
  ttft: { observe: (l: ModelLabels, s: number) => ttft.observe(L(l), s) },
  itl: {
    observe: (model: string, s: number) => {
      itl.observe(model, s);
      tpotPerToken.observe(model, s);
    },
  },
  passes: { inc: (l: ModelLabels & { threads: 'all' | 'one' | 'all_spinning' | 'all_prefill' | 'all_prefill_spinning' | 'one_prefill' | 'all_long' }, v: number) => passes.inc({ model_name: l.model, threads: l.threads }, v) },
  batchSize: { observe: (l: ModelLabels & { phase: string }, v: number) => batchSize.observe({ model_name: l.model, phase: l.phase }, v) },
  kvBytes: { set: (l: ModelLabels, v: number) => kvBytes.set(L(l), folds.kvBytes.set(l, v)) },
  kvUsage: {
    set: (l: ModelLabels, fraction: number) => {
      const m = L(l);
      const all = folds.kvUsage.set(l, fraction);
      kvUsage.set(m, all);
      gpuCacheUsage.set(m, all);
    },
  },
};

/** A generation's timeline in performance.now() milliseconds; undefined for a step it never reached. */
export interface RequestTimeline {
  enqueuedAt: number;
  scheduledAt: number | undefined;
  firstTokenAt: number | undefined;
  endedAt: number;
  promptTokens: number;
  completionTokens: number;
  /** Ours: `cancelled` is vLLM's `abort`; `failed` is counted as `error`. */
  finishReason: 'stop' | 'length' | 'cancelled' | 'failed';
}

/** Observes a finished generation the way vLLM's request-level metrics do (phases that did not happen are not observed). */
export function observeFinished(model: string, t: RequestTimeline): void {
  const m = { model_name: model };
  const s = (ms: number) => Math.max(0, ms) / 1000;
  e2e.observe(m, s(t.endedAt - t.enqueuedAt));
  queue.observe(m, s((t.scheduledAt ?? t.endedAt) - t.enqueuedAt));
  if (t.scheduledAt !== undefined) {
    inferenceTime.observe(m, s(t.endedAt - t.scheduledAt));
    if (t.firstTokenAt !== undefined) prefill.observe(m, s(t.firstTokenAt - t.scheduledAt));
  }
  if (t.firstTokenAt !== undefined) {
    decode.observe(m, s(t.endedAt - t.firstTokenAt));
    if (t.completionTokens > 1) tpotPerRequest.observe(m, s(t.endedAt - t.firstTokenAt) / (t.completionTokens - 1));
  }
  promptLen.observe(m, t.promptTokens);
  genLen.observe(m, t.completionTokens);
  finished.inc({ model_name: model, finished_reason: t.finishReason === 'cancelled' ? 'abort' : t.finishReason === 'failed' ? 'error' : t.finishReason });
}

/**
 * KV-cache usage as a 0-1 fraction. Capacity: the engine holds at most
 * `batchSlots` sequences of at most `contextLength` positions each, so
 * `batchSlots x contextLength` KV positions; held: the positions the live
 * sequences have run through the model. Whoever changes how the KV cache is
 * stored keeps `heldPositions` true and this stays right.
 */
export function kvCacheUsage(heldPositions: number, batchSlots: number, contextLength: number): number {
  const capacity = batchSlots * contextLength;
  if (capacity <= 0) return 0;
  return Math.min(1, Math.max(0, heldPositions / capacity));
}
