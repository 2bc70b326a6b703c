import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import ort from 'onnxruntime-node';
import type { Arch, InitMsg } from './protocol.js';
import { providerEntry } from './execution-provider.js';
import type { LoadedSessions, SessionKind } from './session-choice.js';
import { spinningSessionConfig, spinSessionConfig } from './spin.js';
import { prefillGraph } from './prefill-graph.js';
import { longStepGraph } from './long-steps.js';
import { oneTokenGraph } from './one-token-graph.js';
import { withRewrittenGraphConfig } from './external-data.js';
import { residentSessions, type ResidentSessions } from './kv-resident.js';
import { weightTypeHere } from './integer-products.js';
import { niceThreadsStartedBy, scheduleThisThreadIdle } from './thread-policy.js';

// A model worker's start: its threads' priority, the onnxruntime sessions of its model (the
// graph as converted and the faster variants session-choice.ts picks between) and the model's
// shape as the graph declares it. worker.ts keeps what lives between messages.

/** What a worker loaded for its model. */
export interface LoadedModel {
  /**
   * The graph as converted on InitMsg's provider (or on CPU where that provider failed and `strict` is
   * off); undefined once a GPU model's device cache has run (worker.ts releaseSlotGraph).
   */
  session: ort.InferenceSession | undefined;
  /**
   * The sessions by kind (session-choice.ts): `wide` is `session`; `narrow` the same graph on one
   * intra-op thread, for steps of a few tokens; `spinning` the same graph on every core with
   * threads spinning while a run lasts, for steps while few sequences run; `prefill` the graph
   * with its block-quantized products as int8 ones, for steps of several rows (prefill-graph.ts);
   * `prefillSpinning` that graph on spinning threads, for short steps while few sequences run;
   * `prefillNarrow` that graph on one thread, for steps while other model workers fill the cores (peers.ts);
   * `long` that graph with its attention in pieces of the queries, for long prompts' steps (long-steps.ts).
   */
  byKind: Record<SessionKind, ort.InferenceSession | undefined>;
  /** Which of the extra sessions loaded. */
  loaded: LoadedSessions;
  /**
   * On a GPU provider, a slot-cache model's graph rewritten to keep its cache on the device, and
   * the graph that grows that cache (kv-resident.ts); undefined on the CPU, with KV_ON_DEVICE off,
   * or where they did not load (the cache then lives on the host, as on the CPU).
   */
  resident: ResidentSessions | undefined;
  /** The shared-prefix graph (branch.onnx) of evaluation models, when there is one and it loaded. */
  branchSession: ort.InferenceSession | undefined;
  /** The branch graph with its block-quantized products as int8 ones, for branch steps of many tokens. */
  branchPrefill: ort.InferenceSession | undefined;
  arch: Arch;
  /** The graph takes a slot cache (cache.N.key inputs and cache_bias) rather than past_key_values. */
  slotCache: boolean;
}

/**
 * Loads InitMsg's model; what it leaves out (a session that failed, priorities refused) is told to `warn`, once each.
 * `onShape` is told the model's shape as soon as its first session has loaded, before the others
 * (the kept generations' memory is written meanwhile on another thread: kept-arena.ts).
 */
export async function loadModel(msg: InitMsg, warn: (message: string) => void, onShape?: (arch: Arch, slotCache: boolean) => void): Promise<LoadedModel> {
  const createSession = threadPriorities(msg, warn);
  const base: ort.InferenceSession.SessionOptions = {
    graphOptimizationLevel: 'all',
    intraOpNumThreads: msg.intraOpThreads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    // By default threads that wait for work sleep: spinning ones, even only while a step runs,
    // keep the HTTP thread waiting for a core (ORT_INTRA_OP_SPIN in config.ts, spin.ts).
    extra: { session: spinSessionConfig(msg.spin) },
  };
  let provider = msg.executionProvider;
  const onProvider = (name: string) => providerEntry(name, msg.webgpuValidationMode);
  let session: ort.InferenceSession;
  try {
    session = await createSession(msg.modelPath, { ...base, executionProviders: [onProvider(provider)] });
  } catch (e) {
    if (provider === 'cpu' || msg.strict) throw e;
    // A GPU provider that cannot start falls back to CPU unless told to insist.
    warn(`${provider} failed (${(e as Error).message}); using cpu`);
    provider = 'cpu';
    session = await createSession(msg.modelPath, { ...base, executionProviders: ['cpu'] });
  }
  const { arch, slotCache } = archOf(session, provider);
  onShape?.(arch, slotCache);
  // The extra sessions are only ever faster, so one that fails to load is left out with a warning.
  const extra = async <T = ort.InferenceSession>(what: string, without: string, create: () => Promise<T | undefined>) => {
    try {
      return await create();
    } catch (e) {
      warn(`${what} not loaded (${(e as Error).message}); ${without}`);
      return undefined;
    }
  };
  const cpu = { ...base, executionProviders: ['cpu'] };
  // The prefill sessions run steps of every length, and a memory pattern (one block planned per
  // shape) held ~70 MiB more after 20 prompts of 512 tokens of m25 int4 than the arena alone, at
  // the same speed (bench/README.md "Long steps in float32").
  const prefillOptions = { ...cpu, enableMemPattern: false };
  // A file's prefill graph, made once for its sessions; undefined where it has no block-quantized
  // products to change: nothing to load. One it could not make is not tried again for each session.
  const prefillGraphs = new Map<string, Uint8Array | undefined | Error>();
  const prefillGraphOf = async (file: string): Promise<Uint8Array | undefined> => {
    if (!prefillGraphs.has(file)) {
      const weightType = await weightTypeHere();
      try {
        prefillGraphs.set(file, prefillGraph(fs.readFileSync(file), weightType, path.dirname(file)));
      } catch (e) {
        prefillGraphs.set(file, e as Error);
      }
    }
    const graph = prefillGraphs.get(file);
    if (graph instanceof Error) throw graph;
    return graph;
  };
  const prefillSessionOf = async (file: string, options: ort.InferenceSession.SessionOptions = prefillOptions) => {
    const graph = await prefillGraphOf(file);
    return graph ? createSession(graph, withRewrittenGraphConfig(options, file)) : undefined;
  };
  // The prefill graph with its attention in pieces (long-steps.ts); none where either rewrite finds nothing to change.
  const longSessionOf = async (file: string) => {
    const prefill = await prefillGraphOf(file);
    const graph = prefill && longStepGraph(prefill);
    return graph ? createSession(graph, withRewrittenGraphConfig(prefillOptions, file)) : undefined;
  };
  // The spinning session runs the graph rewritten for one-token steps where it can be (one-token-graph.ts), else the graph as converted.
  let spinningOneToken = false;
  const spinningSessionOf = async (file: string) => {
    const options = { ...cpu, extra: { session: spinningSessionConfig('decode') } };
    let graph: Uint8Array | undefined;
    try {
      graph = msg.oneTokenGraph ? oneTokenGraph(fs.readFileSync(file)) : undefined;
    } catch (e) {
      warn(`one-token graph not made (${(e as Error).message}); the spinning session runs the graph as converted`);
    }
    if (!graph) return createSession(file, options);
    const s = await createSession(graph, withRewrittenGraphConfig(options, file));
    spinningOneToken = true;
    return s;
  };
  // The extra sessions are CPU sessions: a model on a GPU provider runs every step on it.
  const onCpu = provider === 'cpu';
  const byKind: LoadedModel['byKind'] = {
    wide: session,
    // Threads are per session: one thread here, every core in `session`.
    narrow: onCpu && msg.narrowSession ? await extra('one-thread session', `every step runs on ${msg.intraOpThreads} threads`, () => createSession(msg.modelPath, { ...cpu, intraOpNumThreads: 1 })) : undefined,
    spinning: onCpu && msg.spinningSession ? await extra('spinning session', 'steps run on sleeping threads', () => spinningSessionOf(msg.modelPath)) : undefined,
    prefill: onCpu && msg.prefillSession ? await extra('prefill session', 'long steps multiply as short ones do', () => prefillSessionOf(msg.modelPath)) : undefined,
    prefillSpinning:
      onCpu && msg.prefillSession && msg.spinningSession ? await extra('spinning prefill session', 'short steps of several rows run on sleeping threads', () => prefillSessionOf(msg.modelPath, { ...prefillOptions, extra: { session: spinningSessionConfig('prompt') } })) : undefined,
    // Only a worker beside others (peers.ts) steps on one thread while they step: each a core.
    // On one thread anyway, the prefill session is that already.
    prefillNarrow:
      onCpu && msg.prefillNarrowSession && (msg.peers?.live.length ?? 0) > 1 && msg.intraOpThreads > 1 ? await extra('one-thread prefill session', 'a step of several rows beside other busy models runs on every core', () => prefillSessionOf(msg.modelPath, { ...prefillOptions, intraOpNumThreads: 1 })) : undefined,
    long: onCpu && msg.longSession ? await extra('long-step session', "a long prompt's attention runs in one piece", () => longSessionOf(msg.modelPath)) : undefined,
  };
  const loaded = { narrow: !!byKind.narrow, spinning: !!byKind.spinning, spinningOneToken: !!byKind.spinning && spinningOneToken, prefill: !!byKind.prefill, prefillSpinning: !!byKind.prefillSpinning, prefillNarrow: !!byKind.prefillNarrow, long: !!byKind.long };
  if (byKind.prefill || byKind.prefillSpinning) arch.prefillWeights = await weightTypeHere();
  // Only webgpu hands a tensor back on the device (onnxruntime-node's 'gpu-buffer'); elsewhere the cache would go round the host as before.
  const resident =
    slotCache && provider === 'webgpu' && msg.kvOnDevice
      ? await extra('device-resident KV cache', 'every step copies its rows\' cache to the device', async () => {
          const sessions = await residentSessions(msg.modelPath, arch, { ...base, executionProviders: [onProvider(provider)] }, createSession);
          if (!sessions) throw new Error('the graph is not a slot-cache graph with one new_key_values output (convert it again)');
          return sessions;
        })
      : undefined;

  let branchSession: ort.InferenceSession | undefined;
  let branchPrefill: ort.InferenceSession | undefined;
  if (msg.branchModelPath) {
    // The branch graph only makes scoring faster: a model whose branch graph does not load scores without it.
    try {
      const s = await createSession(msg.branchModelPath, { ...base, executionProviders: [onProvider(provider)] });
      if (!s.inputNames.includes('prefix_key_values.0.key')) throw new Error('it has no prefix_key_values inputs');
      branchSession = s;
      arch.sharedPrefix = true;
    } catch (e) {
      warn(`${msg.branchModelPath} not used (${(e as Error).message}); branches are scored with the model graph`);
    }
    if (branchSession && onCpu && msg.prefillSession) {
      const branchPath = msg.branchModelPath;
      branchPrefill = await extra('prefill branch session', 'branch steps multiply as short ones do', () => prefillSessionOf(branchPath));
    }
  }
  return { session, byKind, loaded, resident, branchSession, branchPrefill, arch, slotCache };
}

/**
 * Sets this thread's priority and answers the one way this worker creates sessions, which gives
 * each session's pool threads theirs as they start.
 */
function threadPriorities(msg: InitMsg, warn: (message: string) => void) {
  // On Linux a thread's niceness is its own (setpriority on "this process" acts on the calling
  // thread), and the threads onnxruntime starts next inherit it: the model yields the cores to
  // the HTTP thread, not the other way round. The worker's own thread may stay at the daemon's
  // (thread-policy.ts workerThreadNice); then the pools its sessions start are given `nice` as
  // they start. Elsewhere it would renice the whole daemon: left.
  const linux = process.platform === 'linux';
  if (msg.workerNice > 0 && linux) {
    try {
      os.setPriority(msg.workerNice);
    } catch (e) {
      // A sandbox that refuses setpriority costs the HTTP thread its head start, not the model.
      warn(`model threads left at the daemon's priority: ${(e as Error).message}`);
    }
  }
  // SCHED_IDLE (MODEL_THREADS_SCHED): niceness only lowers the model threads' share, and a request
  // still waited for a core up to their time slice; an idle thread gives way at once.
  if (msg.sched === 'idle') {
    try {
      scheduleThisThreadIdle();
    } catch (e) {
      warn(`model threads left under the normal scheduling policy: ${(e as Error).message}`);
    }
  }
  const poolNice = linux && msg.nice > msg.workerNice ? msg.nice : 0;
  let ortStarted = false;
  let warnedNice = false;
  /** Every session of this worker: its pool (intra-op threads but the caller) at `poolNice`. */
  return async (model: string | Uint8Array, options: ort.InferenceSession.SessionOptions): Promise<ort.InferenceSession> => {
    const create = () => (typeof model === 'string' ? ort.InferenceSession.create(model, options) : ort.InferenceSession.create(model, options));
    const pool = (options.intraOpNumThreads ?? 1) - 1;
    const first = !ortStarted;
    ortStarted = true;
    if (!poolNice || pool < 1) return create();
    const { value, niced } = await niceThreadsStartedBy(create, first ? [pool, pool + 1] : [pool], poolNice);
    // Once a worker: a sandbox that refuses setpriority refuses it for every session.
    if (!niced && !warnedNice) {
      warnedNice = true;
      warn(`a session's threads left at the daemon's priority: other threads started while it loaded, or setpriority refused`);
    }
    return value;
  };
}

/** The model's shape as its graph declares it: layers, KV heads and head size from the cache inputs, the vocabulary from the logits. */
function archOf(session: ort.InferenceSession, provider: string): { arch: Arch; slotCache: boolean } {
  const meta = session.inputMetadata;
  const slotCache = meta.some((m) => m.name === 'cache_bias');
  const pastKeys = meta.filter((m) => (slotCache ? /^cache\.\d+\.key$/ : /^past_key_values\.\d+\.key$/).test(m.name));
  if (pastKeys.length === 0) throw new Error('model has no past_key_values.N.key (or cache.N.key) inputs: not a decoder with a KV cache');
  const k0 = pastKeys[0]! as ort.InferenceSession.TensorValueMetadata;
  const kvHeads = Number(k0.shape[1]);
  const headDim = Number(k0.shape[3]);
  if (!Number.isInteger(kvHeads) || !Number.isInteger(headDim)) throw new Error(`cannot read KV heads and head size from ${k0.name} shape ${JSON.stringify(k0.shape)}`);
  const logitsMeta = session.outputMetadata.find((m) => m.name === 'logits') as ort.InferenceSession.TensorValueMetadata | undefined;
  if (!logitsMeta) throw new Error('model has no logits output');
  const arch: Arch = {
    layers: pastKeys.length,
    kvHeads,
    headDim,
    kvType: k0.type === 'float16' ? 'float16' : 'float32',
    logitsType: logitsMeta.type === 'float16' ? 'float16' : 'float32',
    vocab: Number(logitsMeta.shape[2]) || 0,
    hasPositionIds: meta.some((m) => m.name === 'position_ids'),
    provider,
    sharedPrefix: false,
    keepsGenerations: false,
  };
  if (slotCache && (arch.kvType !== 'float32' || arch.logitsType !== 'float32')) throw new Error('a slot-cache graph keeps a float32 cache and float32 logits');
  return { arch, slotCache };
}
