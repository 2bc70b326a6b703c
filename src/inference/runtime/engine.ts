import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { log } from '../../log.js';
import { branchFileOf, modelFileOf, parseModelConfig, type ModelDtype, type ModelKind } from '../convert/model-config.js';
import type { ChatMessage, GenerateEvent, GenerateRequest, InferenceEngine, ScoreRequest, ScoreResult, ServedModel } from '../engine-api.js';
import { deviceLockCell } from './device-lock.js';
import { engineMetrics } from './metrics.js';
import { defaultEngineOptions, type EngineOptions } from './options.js';
import { Runner, RunnerClosed } from './runner.js';
import { peerShares } from './peers.js';
import { pickReplica } from './replicas.js';
import { Scheduler } from './scheduler.js';
import type { LoadedSessions } from './session-choice.js';
import type { WebgpuValidationMode } from './execution-provider.js';
import type { ThreadSpin } from './spin.js';
import { type ModelThreadSched, workerThreadNice } from './thread-policy.js';
import { ModelText } from './text.js';
import { TOKENS_POST_INTERVAL_MS } from './token-posts.js';

// The model registry and the engine facade: every folder of MODELS_DIR with a
// cloudgate.json is a model, loaded into its own worker with its own scheduler.


interface Loaded {
  info: ServedModel;
  text: ModelText;
  /** The model's workers and their schedulers, index for index: one, or a chat model's MODEL_REPLICAS (replicas.ts). */
  runners: Runner[];
  schedulers: Scheduler[];
}

export interface EngineConfig {
  modelsDir: string;
  executionProvider: 'cpu' | 'webgpu' | 'cuda';
  strict: boolean;
  /** ORT_INTRA_OP_THREADS for every model; undefined: each model's own (threadsFor). */
  intraOpThreads?: number;
  /** MODEL_THREADS_NICE: the model threads' niceness (Linux); 0 or absent leaves it. */
  threadsNice?: number;
  /** MODEL_THREADS_SCHED: their scheduling policy (thread-policy.ts); absent: normal. */
  threadsSched?: ModelThreadSched;
  /** ORT_INTRA_OP_SPIN: how intra-op threads wait between operators (spin.ts); default `off`. */
  threadsSpin?: ThreadSpin;
  /** ORT_NARROW_SESSION: a model on several threads also loads a one-thread session for narrow steps (extraSessionsFor). */
  narrowSession?: boolean;
  /** ORT_SPINNING_SESSION: such a model also loads a session whose threads spin while a step runs, for steps while few sequences run (extraSessionsFor). */
  spinningSession?: boolean;
  /** ORT_ONE_TOKEN_GRAPH: that session runs the slot graph rewritten for steps of one token a row (one-token-graph.ts). */
  oneTokenGraph?: boolean;
  /** ORT_PREFILL_SESSION: a model of block-quantized weights also loads its graph with those products as int8 ones, for steps of several rows (extraSessionsFor). */
  prefillSession?: boolean;
  /** ORT_LONG_STEP_SESSION: such a model also loads that graph with its attention in pieces, for long prompts' steps (extraSessionsFor). */
  longSession?: boolean;
  /** TOKENS_POST_INTERVAL_MS: how long a decode run's fast steps are held before their tokens are posted (token-posts.ts). */
  tokensPostIntervalMs?: number;
  /** MODEL_REPLICAS: workers of each chat model on the CPU, its requests spread over them (replicas.ts); default 1. */
  replicas?: number;
  /** KV_SPLIT_LONG_ROWS: a chat model's far longer sequences keep their cache apart and step as their own run (kv-pools.ts); default true. */
  kvSplit?: boolean;
  /** WEBGPU_VALIDATION_MODE: how much Dawn checks each webgpu dispatch; unset, onnxruntime's default. */
  webgpuValidationMode?: WebgpuValidationMode;
  /** KV_ON_DEVICE: on a GPU provider, a chat model's KV cache stays on the device between steps (kv-resident.ts); default true. */
  kvOnDevice?: boolean;
  /** MODEL_DTYPE: the weight variant served by every folder that holds it, over cloudgate.json's `dtype` */
  dtype?: ModelDtype;
  options?: Partial<EngineOptions>;
}

/**
 * Below this size a model's graph (weights included) runs each operator in microseconds,
 * and waking a second intra-op thread per operator costs more than it saves: stories260K
 * (1 MB) made 2,230 / 10,804 tokens/s at 1 / 16 streams on one thread and 1,773-1,794 /
 * 8,448-9,127 on two; m25 int4 (18 MB) 16 streams went 977 -> 1,254 tokens/s with two.
 */
const MULTI_THREAD_MODEL_BYTES_MIN = 4 * 2 ** 20;

/**
 * Above this size a model gets no one-thread or spinning session beside its every-core one
 * (session-choice.ts): each holds another copy of the weights, and a step of such a model is
 * long enough that the other threads' wake-ups are a small part of it (m110 int8, 98 MB,
 * already steps faster on two threads at batch 1).
 */
const EXTRA_SESSIONS_MODEL_BYTES_MAX = 256 * 2 ** 20;

/**
 * Above this size a model of block-quantized weights gets no prefill session (its products as int8
 * ones, prefill-graph.ts): that graph must stay under protobuf's 2 GiB, about 1.1 GiB of a q4
 * model's files. Past EXTRA_SESSIONS_MODEL_BYTES_MAX it makes prompts faster still (m450 int4, 287
 * MB: a 512-token prompt's first token in 0.47 of the time it takes without, bench/README.md "A larger
 * model"), but costs PREFILL_SESSION_BYTES_PER_MODEL_BYTE times the model's files in memory, so
 * there it loads only where that fits in PREFILL_SESSION_MEMORY_SHARE of the memory the process may use.
 */
const PREFILL_SESSION_MODEL_BYTES_MAX = 2 ** 30;
/**
 * A prefill session's memory against the model's files, for each graph that gets one (an
 * evaluation model's branch graph gets its own): m450 int4 (287 MB of files) held 2.03 GB after
 * load with it and 0.55 GB without (5.1x; the int8 weights, onnxruntime's copy of the graph it was
 * given, its packed weights and the long steps' buffers); the m450-shaped evaluation model, both
 * graphs, 2.94 GB against 0.93 (3.5x each).
 */
const PREFILL_SESSION_BYTES_PER_MODEL_BYTE = 5;
/** Of the memory the process may use, what one model's prefill session may take past EXTRA_SESSIONS_MODEL_BYTES_MAX: other models, their KV caches and the HTTP side need the rest. */
const PREFILL_SESSION_MEMORY_SHARE = 0.25;

/**
 * Of the memory the process may use, what one worker's kept generations take when it loads
 * (kept-arena.ts): the default 256 MiB on a machine or container of 2 GiB or more. A budget past
 * it (CHAT_PREFIX_CACHE_MB goes up to 1 TiB) takes the rest as it fills, so a large one cannot
 * fail a model's load or take a machine's memory before anything is kept.
 */
const KEPT_AT_LOAD_MEMORY_SHARE = 1 / 8;

/** Of a worker's kept-generations budget, the bytes it takes when it loads (KEPT_AT_LOAD_MEMORY_SHARE). */
export const keptBytesAtLoad = (budget: number, memory = memoryForModels()): number => Math.min(budget, Math.floor(KEPT_AT_LOAD_MEMORY_SHARE * memory));

/** The memory this process may use: its cgroup's bound (a container's limit), or the machine's. */
export function memoryForModels(): number {
  const bound = process.constrainedMemory?.();
  return bound && bound < os.totalmem() ? bound : os.totalmem();
}

/** The weight variants of block-quantized matrices (MatMulNBits), which a prefill session may speed up (prefill-graph.ts). */
const BLOCK_QUANTIZED_DTYPES: ReadonlySet<ModelDtype> = new Set(['int8', 'q4', 'q4f16']);

/** A model's graph and weights on disk. */
function modelBytes(modelFile: string): number {
  // Weights beside the graph: ours (`model.onnx.data`) and the optimum exporters' (`model.onnx_data`).
  const side = [`${modelFile}.data`, `${modelFile}_data`].filter((f) => fs.existsSync(f));
  return [modelFile, ...side].reduce((n, f) => n + fs.statSync(f).size, 0);
}

/** A model's intra-op threads when ORT_INTRA_OP_THREADS does not say: every core, one for a tiny model. */
export function threadsFor(modelFile: string): number {
  return modelBytes(modelFile) < MULTI_THREAD_MODEL_BYTES_MIN ? 1 : os.availableParallelism();
}

/**
 * The sessions a CPU model on `threads` intra-op threads loads beside its every-core one, as
 * ORT_NARROW_SESSION, ORT_SPINNING_SESSION and ORT_PREFILL_SESSION allow: a one-thread session,
 * one whose threads spin while a step runs (which only differs from the every-core one when that
 * one's sleep), and, for a variant of block-quantized weights (`dtype`), its graph with those
 * products as int8 ones for steps of several rows, on any number of threads (the worker leaves
 * it out where the graph has no such products), and where it has both, that graph on spinning
 * threads too, for short steps while few sequences run. `prefillNarrow`: that graph may load on one
 * thread too, beside busy peers (the worker decides), where the model is small enough for more copies;
 * `long`: that graph with its attention in pieces of the queries, for long steps (long-steps.ts), as
 * ORT_LONG_STEP_SESSION allows, where the model is small enough for one more copy.
 * `memory`: memoryForModels(); `graphs`: the graphs that would get a prefill session (2 for an
 * evaluation model with its branch graph).
 */
export function extraSessionsFor(
  modelFile: string,
  threads: number,
  dtype: ModelDtype,
  allow: { narrow: boolean; spinning: boolean; prefill: boolean; long?: boolean; spin: ThreadSpin },
  { memory = memoryForModels(), graphs = 1 }: { memory?: number; graphs?: number } = {},
): Required<Omit<LoadedSessions, 'spinningOneToken'>> {
  const bytes = modelBytes(modelFile);
  const small = bytes <= EXTRA_SESSIONS_MODEL_BYTES_MAX;
  const fits = threads > 1 && small;
  const spinning = fits && allow.spinning && allow.spin === 'off';
  const prefillFits = small || (bytes <= PREFILL_SESSION_MODEL_BYTES_MAX && graphs * PREFILL_SESSION_BYTES_PER_MODEL_BYTE * bytes <= PREFILL_SESSION_MEMORY_SHARE * memory);
  const prefill = prefillFits && allow.prefill && BLOCK_QUANTIZED_DTYPES.has(dtype);
  return { narrow: fits && allow.narrow, spinning, prefill, prefillSpinning: spinning && prefill, prefillNarrow: prefill && small, long: prefill && small && allow.long !== false };
}

/** The weight variant a folder serves: the daemon-wide choice where the folder has it, else its cloudgate.json's. */
export function pickVariant(dir: string, own: ModelDtype, daemonWide?: ModelDtype): ModelDtype {
  if (daemonWide && daemonWide !== own) {
    if (fs.existsSync(path.join(dir, modelFileOf(daemonWide)))) return daemonWide;
    log.warn({ dir, dtype: daemonWide, serving: own }, `MODEL_DTYPE=${daemonWide}: no ${modelFileOf(daemonWide)} in this folder`);
  }
  if (!fs.existsSync(path.join(dir, modelFileOf(own)))) throw new Error(`cloudgate.json dtype ${own}: ${modelFileOf(own)} is missing`);
  return own;
}

/**
 * The worker's init fields for the extra sessions of a model on the CPU. A worker whose GPU
 * provider starts loads none; one that falls back to the CPU loads these.
 */
function extraSessions(
  cfg: EngineConfig,
  modelPath: string,
  threads: number,
  dtype: ModelDtype,
  kind: ModelKind,
  branchModelPath: string | undefined,
): { narrowSession: boolean; spinningSession: boolean; prefillSession: boolean; prefillNarrowSession: boolean; longSession: boolean } {
  // An evaluation model's graphs keep the past layout, whose attention long-steps.ts does not cut: no long-step session to try.
  const long = cfg.longSession !== false && kind === 'chat';
  const allow = { narrow: cfg.narrowSession !== false, spinning: cfg.spinningSession !== false, prefill: cfg.prefillSession !== false, long, spin: cfg.threadsSpin ?? 'off' };
  const x = extraSessionsFor(modelPath, threads, dtype, allow, { graphs: branchModelPath ? 2 : 1 });
  return { narrowSession: x.narrow, spinningSession: x.spinning, prefillSession: x.prefill, prefillNarrowSession: x.prefillNarrow, longSession: x.long };
}

/** Every engine of this process on webgpu shares onnxruntime's one webgpu context, so one lock (device-lock.ts). */
let deviceLock: SharedArrayBuffer | undefined;
const processDeviceLock = (): SharedArrayBuffer => (deviceLock ??= deviceLockCell());

export class Engine implements InferenceEngine {
  private constructor(private readonly models: Map<string, Loaded>) {}

  static async load(cfg: EngineConfig): Promise<Engine> {
    const models = new Map<string, Loaded>();
    const opts = { ...defaultEngineOptions, ...cfg.options };
    const names = fs.existsSync(cfg.modelsDir) ? fs.readdirSync(cfg.modelsDir).sort() : [];
    const dirs = names.filter((name) => fs.existsSync(path.join(cfg.modelsDir, name, 'cloudgate.json')));
    // A place for every CPU worker there may be (peers.ts); a folder that fails to load leaves its own empty.
    const workersMax = dirs.length * (cfg.replicas ?? 1);
    const shares = cfg.executionProvider === 'cpu' ? peerShares(workersMax, os.availableParallelism()) : [];
    const nice = cfg.threadsNice ?? 0;
    const sched = cfg.threadsSched ?? 'normal';
    // Under SCHED_IDLE, or on a GPU, the worker's thread and its pools alike (thread-policy.ts).
    const workerNice = cfg.executionProvider === 'cpu' && sched === 'normal' ? workerThreadNice(nice, workersMax, os.availableParallelism()) : nice;
    for (const name of dirs) {
      const dir = path.join(cfg.modelsDir, name);
      const cfgFile = path.join(dir, 'cloudgate.json');
      try {
        const c = parseModelConfig(JSON.parse(fs.readFileSync(cfgFile, 'utf8')));
        if (models.has(c.id)) throw new Error(`duplicate model id ${c.id}`);
        const text = new ModelText(dir);
        const dtype = pickVariant(dir, c.dtype, cfg.dtype);
        const branchPath = path.join(dir, branchFileOf(dtype));
        const tokenTexts = text.tokenTexts();
        const modelPath = path.join(dir, modelFileOf(dtype));
        const threads = cfg.intraOpThreads ?? threadsFor(modelPath);
        const branchModelPath = c.kind === 'evaluation' && fs.existsSync(branchPath) ? branchPath : undefined;
        const extra = extraSessions(cfg, modelPath, threads, dtype, c.kind, branchModelPath);
        // Replicas step on one thread beside busy peers (peers.ts): only where that session loads (or one thread is all there is).
        const replicable = c.kind === 'chat' && cfg.executionProvider === 'cpu' && (extra.narrowSession || threads === 1);
        const count = replicable ? (cfg.replicas ?? 1) : 1;
        if (!replicable && (cfg.replicas ?? 1) > 1) log.info({ model: c.id, kind: c.kind }, 'MODEL_REPLICAS: one worker for this model (replicas are for chat models on the CPU with a one-thread session)');
        log.info({ model: c.id, dtype, dir }, 'loading model');
        const init = {
          tokenTexts,
          modelPath,
          branchModelPath,
          executionProvider: cfg.executionProvider,
          strict: cfg.strict,
          intraOpThreads: threads,
          ...extra,
          positionsMax: c.contextLength,
          joinedStepTokensMax: opts.prefillTokensPerStepMax,
          stepTokensMax: opts.prefillTokensPerIdleStepMax,
          nice,
          workerNice,
          sched,
          spin: cfg.threadsSpin ?? 'off',
          oneTokenGraph: cfg.oneTokenGraph ?? true,
          tokensPostIntervalMs: cfg.tokensPostIntervalMs ?? TOKENS_POST_INTERVAL_MS,
          kvSplit: cfg.kvSplit ?? true,
          kvOnDevice: cfg.kvOnDevice ?? true,
          webgpuValidationMode: cfg.webgpuValidationMode,
          // webgpu only: onnxruntime's CUDA provider runs sessions from several threads by design.
          deviceLock: cfg.executionProvider === 'webgpu' ? processDeviceLock() : undefined,
          modelBytes: modelBytes(modelPath),
          keptBytesMax: c.kind === 'chat' ? opts.chatPrefixCacheBytesMax : 0,
          keptBytesAtLoad: c.kind === 'chat' ? keptBytesAtLoad(opts.chatPrefixCacheBytesMax) : 0,
        };
        const runners: Runner[] = [];
        // One after another: each worker's warm-up measures its sessions on cores the others leave idle.
        for (let r = 0; r < count; r++) runners.push(await Runner.start({ ...init, peers: shares.shift() }, c.id, r));
        const schedulers = runners.map((w) => new Scheduler(c.id, w, text, opts, c.contextLength));
        const runner = runners[0]!;
        const info: ServedModel = {
          id: c.id,
          kind: c.kind,
          contextLength: c.contextLength,
          charsPerTokenMax: text.charsPerTokenMax,
          vocabSize: runner.arch.vocab,
          structuredOutput: tokenTexts !== undefined,
          maxTokensCap: c.maxTokensCap ?? c.contextLength,
          maxTokensDefault: Math.min(c.maxTokensDefault ?? 256, c.maxTokensCap ?? c.contextLength),
          prices: c.prices,
          ownedBy: c.ownedBy,
          created: c.created,
        };
        models.set(c.id, { info, text, runners, schedulers });
        engineMetrics.modelInfo.set({ model: c.id, provider: runner.arch.provider, dtype });
        log.info({ model: c.id, kind: c.kind, dtype, provider: runner.arch.provider, arch: runner.arch, sessions: runner.sessions, warmUp: runner.warmPace, replicas: count > 1 ? count : undefined }, 'model loaded');
      } catch (e) {
        // The process exits (threads-at-exit.ts): the rest need not load.
        if (e instanceof RunnerClosed) break;
        // One broken folder must not keep the others from serving.
        log.error({ dir, err: e }, 'model folder skipped');
      }
    }
    return new Engine(models);
  }

  private get(id: string): Loaded {
    const m = this.models.get(id);
    if (!m) throw new Error(`model ${id} is not loaded`);
    return m;
  }

  list(): ServedModel[] {
    return [...this.models.values()].map((m) => m.info);
  }

  model(id: string): ServedModel | undefined {
    return this.models.get(id)?.info;
  }

  encodeChat(modelId: string, messages: ChatMessage[]): Promise<number[]> {
    return this.get(modelId).text.encodeChat(messages);
  }

  encode(modelId: string, text: string): Promise<number[]> {
    return this.get(modelId).text.encodeAsync(text);
  }

  /** Plain text; with special tokens, BOS first as the model's tokenizer config says (vLLM's /tokenize). */
  async encodeText(modelId: string, text: string, addSpecialTokens: boolean): Promise<number[]> {
    const t = this.get(modelId).text;
    const ids = await t.encodeAsync(text);
    return addSpecialTokens ? [...t.bosTokens(), ...ids] : ids;
  }

  decode(modelId: string, ids: number[]): string {
    return this.get(modelId).text.decode(ids);
  }

  /** Each token's own vocabulary entry (e.g. `▁Once`), as vLLM's token_strs. */
  tokenStrings(modelId: string, ids: number[]): string[] {
    const tok = this.get(modelId).text.tokenizer;
    return ids.map((id) => tok.id_to_token(id) ?? '');
  }

  /** The bytes each token adds to text (a byte-fallback token is its one byte), for logprobs. */
  tokenBytes(modelId: string, id: number): Uint8Array {
    const t = this.get(modelId).text;
    return t.pieces?.[id] ?? new TextEncoder().encode(t.decode([id]));
  }

  bosTokens(modelId: string): number[] {
    return this.get(modelId).text.bosTokens();
  }

  generate(modelId: string, req: GenerateRequest): AsyncGenerator<GenerateEvent> {
    const schedulers = this.get(modelId).schedulers;
    // The replica holding the most of this prompt's opening (an earlier turn of the conversation, kept or still running) runs it.
    let holder: Scheduler | undefined;
    let most = 0;
    if (schedulers.length > 1) {
      for (const s of schedulers) {
        const n = s.keptOpening(req.promptTokens, req.shareScope);
        if (n > most && s.alive) [holder, most] = [s, n];
      }
    }
    return (holder ?? pickReplica(schedulers)).generate(req);
  }

  scoreBranches(modelId: string, req: ScoreRequest): Promise<ScoreResult> {
    const schedulers = this.get(modelId).schedulers;
    // The replica that holds this prefix (prefilling or kept) runs it no second time.
    const holder = schedulers.length > 1 ? schedulers.find((s) => s.holdsPrefix(req.prefixTokens, req.shareScope)) : undefined;
    return (holder ?? pickReplica(schedulers)).scoreBranches(req.prefixTokens, req.branches, req.signal, req.shareScope);
  }

  async close(): Promise<void> {
    // webgpu workers release their sessions holding the device lock (device-lock.ts), one at a time.
    await Promise.all([...this.models.values()].flatMap((m) => m.runners.map((r) => r.close())));
  }
}
