import v8 from 'node:v8';
import { parentPort, receiveMessageOnPort } from 'node:worker_threads';
import ort from 'onnxruntime-node';
import { noPasses, type Arch, type ModelPasses, type WorkerEvent, type WorkerCommand, type SamplerSpec, type StepRow, type WarmPace } from './protocol.js';
import { KvStore, kvBytesPerPosition, type Kv } from './kv.js';
import { KvSlots, slotStepDone, slotStepFeeds } from './kv-slots.js';
import { KeptArena, type KeptKv } from './kept-arena.js';
import { keptBytesOf } from './kept-prompts.js';
import { KvPools } from './kv-pools.js';
import { DeviceLock } from './device-lock.js';
import { ResidentSlots, type ResidentLayoutOf } from './kv-resident.js';
import type { TokenLogprob } from '../engine-api.js';
import { draw, Maskers, startSampling, type Sampling } from './generation.js';
import { PEERS_REST_AFTER_IDLE_MS, WorkerPeers } from './peers.js';
import { LONG_SESSION_STEP_TOKENS_MIN, medianOf, SessionChoice, sessionsFor, type LoadedSessions } from './session-choice.js';
import { inStepBudget } from './options.js';
import { fp16BitsToFp32 } from '../convert/quantize.js';
import { sharedNow, TOKENS_POSTED_AT_ONCE, TokenPosts } from './token-posts.js';
import { loadModel, type LoadedModel } from './worker-sessions.js';

// One model's ONNX session, run on this thread (session.run blocks it), the
// KV cache of every live sequence (kv.ts) and the batch of the last step.

const port = parentPort!;

/**
 * Everything this worker holds between messages, in one place: its model (sessions and
 * shapes), the KV cache of every live sequence, the batch of the last step, each token's
 * text for grammar masks, and the flags of the run in progress.
 */
interface WorkerState extends LoadedModel {
  /** With any of the extra sessions loaded (LoadedModel.loaded), picks a step's session. */
  choice: SessionChoice | undefined;
  /** Picks a branch step's session where `branchPrefill` loaded: its own, since a branch step's cost is not a model step's. */
  branchChoice: SessionChoice | undefined;
  store: KvStore;
  /** The cache of a slot-cache graph (cache.N.key inputs), on the device where `resident` loaded; the store then stays empty. */
  slots: KvPools | ResidentSlots | undefined;
  batch: BatchState | undefined;
  /** Grammar masks over this model's tokens' texts (InitMsg.tokenTexts), for structured output. */
  maskers: Maskers;
  /** The last decode run (its message id) the main thread asked to stop after its current step; -1: none. */
  interruptedRun: number;
  /** A close arrived: any decode run, in flight or queued before it, stops after its current step. */
  closeRequested: boolean;
  /** A decode run is in progress (joins run between its steps). */
  inRun: boolean;
  /**
   * Decode runs received and not yet begun (behind other work in the serial queue): a prompt
   * arriving meanwhile joins the first of them, at its first step, instead of queueing behind it
   * for all of its steps.
   */
  runsQueued: number;
  /** The run's tokens not yet posted: flushed before any other message leaves (token-posts.ts). */
  tokenPosts: TokenPosts | undefined;
  /** InitMsg.tokensPostIntervalMs. */
  tokensPostIntervalMs: number;
  /** InitMsg.joinedStepTokensMax. */
  joinedStepTokensMax: number;
  /** InitMsg.stepTokensMax. */
  stepTokensMax: number;
  /** A step is in flight: frees wait for it. */
  busy: boolean;
  /** Model work, one piece at a time in arrival order. */
  queue: Promise<void>;
  /** Pieces of work queued or running: at none, the worker rests for its peers (restWhenIdle). */
  pending: number;
  /** Forward passes so far by session, reported with every step's answer and decode run's end (metrics). */
  passes: ModelPasses;
  /** The daemon's other model workers (peers.ts): told this one's live sequences, asked whether theirs fill the cores. */
  peers: WorkerPeers;
  /** Ended generations kept for later prompts to start from (StepRow.from; InitMsg.keptBytesMax, Arch.keepsGenerations), out of the slots (KvSlots.takeOut). */
  kept: Map<number, KeptKv>;
  /** Their memory, taken at load (kept-arena.ts); undefined where none are kept. */
  arena: KeptArena | undefined;
  /** InitMsg.keptBytesMax. */
  keptBytesMax: number;
  /** The process's webgpu device lock (device-lock.ts), held for every use of the device; undefined elsewhere. */
  device: DeviceLock | undefined;
}
// The model (LoadedModel) and store are set by init, the first message, before any other is handled.
const w = {
  choice: undefined,
  branchChoice: undefined,
  slots: undefined,
  batch: undefined,
  maskers: new Maskers([]),
  interruptedRun: -1,
  closeRequested: false,
  inRun: false,
  runsQueued: 0,
  tokenPosts: undefined,
  tokensPostIntervalMs: 0,
  joinedStepTokensMax: 0,
  stepTokensMax: 0,
  busy: false,
  queue: Promise.resolve(),
  pending: 0,
  passes: noPasses(),
  peers: new WorkerPeers(),
  kept: new Map(),
  arena: undefined,
  keptBytesMax: 0,
  device: undefined,
} as Partial<WorkerState> as WorkerState;

async function init(msg: Extract<WorkerCommand, { type: 'init' }>): Promise<void> {
  w.maskers = new Maskers(msg.tokenTexts ?? []);
  w.tokensPostIntervalMs = msg.tokensPostIntervalMs;
  w.joinedStepTokensMax = msg.joinedStepTokensMax;
  w.stepTokensMax = msg.stepTokensMax;
  w.peers = new WorkerPeers(msg.peers);
  const warn = (message: string) => port.postMessage({ type: 'warning', message } satisfies WorkerEvent);
  // A slot cache on the host keeps generations (below); on the CPU that is known once the first session has loaded.
  const keptArena = (arch: Arch) => (w.arena ??= new KeptArena({ ...arch, positionsMax: msg.positionsMax }, msg.keptBytesAtLoad, warn));
  Object.assign(w, await loadModel(msg, warn, (arch, slotCache) => void (msg.keptBytesMax > 0 && slotCache && arch.provider === 'cpu' && keptArena(arch))));
  if (Object.values(w.loaded).some(Boolean)) w.choice = new SessionChoice();
  if (w.branchPrefill) w.branchChoice = new SessionChoice();
  w.store = new KvStore(w.arch);
  // A second run per step costs another pass over the weights on the CPU; on a GPU, another step's launches.
  const onCpu = w.arch.provider === 'cpu';
  // Capacities bounded by the generations' reach (kv-slots.ts grownCapacity) are measured on the
  // CPU only: on a GPU each new cache shape may cost its kernels' compilation, and none was lent to measure it.
  const slotLayout = { ...w.arch, positionsMax: msg.positionsMax, emptyCacheFeeds: onCpu, ...(onCpu ? { positionsLeft } : {}) };
  const resident = w.slotCache && w.resident ? await residentSlotsThatRun({ ...w.arch, positionsMax: msg.positionsMax }) : undefined;
  if (resident) await releaseSlotGraph();
  if (w.slotCache) w.slots = resident ?? new KvPools(slotLayout, msg.modelBytes, msg.kvSplit && onCpu);
  // Only a slot cache on the host: a graph of past_key_values in and presents out (a Hugging Face
  // export) may not continue a cache by more than one token a step (tiny-random-llama-hf's mask
  // subgraph refuses: "invalid expand shape"), and a device cache has no copy here.
  w.keptBytesMax = msg.keptBytesMax;
  w.arch.keepsGenerations = msg.keptBytesMax > 0 && w.slots instanceof KvPools;
  if (w.arch.keepsGenerations) keptArena(w.arch);
  // The warm-up times the sessions on cores no page writing takes.
  await w.arena?.touched;
}

/**
 * Once the device cache has run, the slot graph's own session is never run again: every step is the
 * rewritten graph's, which holds the same weights. Released, so the weights sit in GPU memory once,
 * not twice (m110 in f32: 328 MB more; a 7B model in f16, 13 GB). A GPU model has no other session
 * of that graph (the extra sessions are CPU ones).
 */
async function releaseSlotGraph(): Promise<void> {
  const plain = w.session!;
  w.session = undefined;
  w.byKind.wide = undefined;
  await plain.release();
}

/**
 * The device-resident cache, once a prompt step and a decode step have run on it: its kernels are
 * compiled at their first run, and one the adapter refuses (a shader over its storage-buffer limit
 * failed so on lavapipe) then leaves the model on the host cache at load instead of failing requests.
 */
async function residentSlotsThatRun(layout: ResidentLayoutOf): Promise<ResidentSlots | undefined> {
  const sessions = w.resident!;
  const trial = new ResidentSlots(layout, sessions);
  try {
    const run = (feeds: Record<string, ort.Tensor>) => sessions.step.run(feeds);
    await trial.step([{ seq: WARM_UP_SEQ, tokens: [0, 0] }], run);
    await trial.step([{ seq: WARM_UP_SEQ, tokens: [0] }], run);
    trial.dispose(); // its tensor too: the first request makes one of its own size
    return trial;
  } catch (e) {
    trial.dispose();
    port.postMessage({ type: 'warning', message: `device-resident KV cache not used (${(e as Error).message.split('\n')[0]}); every step copies its rows' cache to the device` } satisfies WorkerEvent);
    w.resident = undefined;
    await Promise.all([sessions.step.release(), sessions.grow.release()]);
    return undefined;
  }
}

/** The sessions a branch step may run on: its graph as converted, and with its products as int8 ones for many tokens. */
const BRANCH_SESSIONS: LoadedSessions = { narrow: false, spinning: false, prefill: true, prefillSpinning: false };

/**
 * The batch of the last step stays in the session's own output tensors: when
 * the next step is the same rows with one token each (steady decoding), the
 * presents are fed back as the pasts with no copying, as in a plain loop.
 * `mask` says, per row, which of the P positions hold that row's tokens (pads
 * sit where rows joined with shorter pasts or shorter chunks); a row's i-th
 * token is at absolute position `offset + i` (the shared prefix's length
 * after a branch-graph step, whose tensors hold only positions after it).
 */
interface BatchState {
  seqs: number[];
  past: Record<string, ort.Tensor>;
  P: number;
  mask: BigInt64Array; // B x P, 1n where a row has a token: fed to the session as is
  offset: number;
  /** Written by the branch graph: never fed back as a steady batch. */
  shared: boolean;
}

/** Writes the batch tensors back into the per-sequence stores; needed before the rows change. */
function materialize(): void {
  if (!w.batch) return;
  const { seqs, past, P, mask, offset } = w.batch;
  const { layers, kvHeads: H, headDim: D } = w.arch;
  for (let b = 0; b < seqs.length; b++) {
    const kv = w.store.get(seqs[b]!);
    if (!kv) continue;
    w.store.grow(kv, kv.len);
    const positions: number[] = [];
    for (let j = 0; j < P; j++) if (mask[b * P + j] === 1n) positions.push(j);
    for (let l = 0; l < layers; l++) {
      for (const which of ['key', 'value'] as const) {
        const src = past[`past_key_values.${l}.${which}`]!.data as Float32Array | Uint16Array;
        const dst = which === 'key' ? kv.k[l]! : kv.v[l]!;
        for (let h = 0; h < H; h++) {
          const base = (b * H + h) * P;
          // Runs of consecutive positions copy as one block; shared base positions are the parent's.
          let i = Math.max(0, kv.baseLen - offset);
          while (i < positions.length) {
            let j = i;
            while (j + 1 < positions.length && positions[j + 1] === positions[j]! + 1) j++;
            dst.set(src.subarray((base + positions[i]!) * D, (base + positions[j]! + 1) * D), (h * kv.cap + offset + i - kv.baseLen) * D);
            i = j + 1;
          }
        }
      }
    }
  }
  w.batch = undefined;
}

interface StepInputs {
  feeds: Record<string, ort.Tensor>;
  /** Past width (rows left-padded to it) and total width of the mask. */
  P: number;
  T: number;
  mask: BigInt64Array;
}

/**
 * The feeds of a step whose row b holds `rows[b].tokens` new tokens after
 * its cached positions [from, len): rows are left-padded to the longest past
 * and the longest new run, and the attention mask hides every pad. A steady
 * batch's pasts are its last presents, fed back as they are.
 */
function stepInputs(rows: StepRow[], kvs: Kv[], from: number, positions: boolean, steady?: BatchState): StepInputs {
  const B = rows.length;
  const { layers, kvHeads: H, headDim: D } = w.arch;
  const P = steady ? steady.P : Math.max(...kvs.map((k) => k.len - from));
  const S = Math.max(...rows.map((r) => r.tokens.length));
  const T = P + S;
  const ids = new BigInt64Array(B * S);
  const pos = new BigInt64Array(B * S);
  const mask = new BigInt64Array(B * T);
  for (let b = 0; b < B; b++) {
    const kv = kvs[b]!;
    if (steady) mask.set(steady.mask.subarray(b * P, (b + 1) * P), b * T);
    else mask.fill(1n, b * T + P - (kv.len - from), b * T + P);
    const toks = rows[b]!.tokens;
    const off = S - toks.length;
    for (let i = 0; i < toks.length; i++) {
      ids[b * S + off + i] = BigInt(toks[i]!);
      pos[b * S + off + i] = BigInt(kv.len + i);
      mask[b * T + P + off + i] = 1n;
    }
  }
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', ids, [B, S]),
    attention_mask: new ort.Tensor('int64', mask, [B, T]),
  };
  if (positions) feeds.position_ids = new ort.Tensor('int64', pos, [B, S]);
  if (steady) Object.assign(feeds, steady.past);
  else {
    for (let l = 0; l < layers; l++) {
      for (const which of ['key', 'value'] as const) {
        const buf = w.store.alloc(B * H * P * D);
        for (let b = 0; b < B; b++) {
          const kv = kvs[b]!;
          const pad = P - (kv.len - from);
          for (let h = 0; h < H; h++) w.store.copySpan(kv, l, which, h, from, kv.len, buf, ((b * H + h) * P + pad) * D);
        }
        feeds[`past_key_values.${l}.${which}`] = new ort.Tensor(w.arch.kvType, buf, [B, H, P, D]);
      }
    }
  }
  return { feeds, P, T, mask };
}

/** Last-position logits of every row, as float32 (the branch graph outputs only that position). */
function lastLogits(logits: ort.Tensor, B: number): Float32Array {
  const [, S, V] = logits.dims.map(Number) as [number, number, number];
  const last = new Float32Array(B * V);
  const data = logits.data as Float32Array | Uint16Array;
  for (let b = 0; b < B; b++) {
    const from = (b * S + S - 1) * V;
    if (w.arch.logitsType === 'float16') for (let i = 0; i < V; i++) last[b * V + i] = fp16BitsToFp32(data[from + i]!);
    else last.set((data as Float32Array).subarray(from, from + V), b * V);
  }
  return last;
}

function presents(out: ort.InferenceSession.OnnxValueMapType): Record<string, ort.Tensor> {
  const past: Record<string, ort.Tensor> = {};
  for (let l = 0; l < w.arch.layers; l++) for (const which of ['key', 'value'] as const) past[`past_key_values.${l}.${which}`] = out[`present.${l}.${which}`]!;
  return past;
}

/** Counts the step's tokens into its rows and keeps its presents as the batch (the stores are stale for these rows until materialize()). */
function afterStep(rows: StepRow[], kvs: Kv[], out: ort.InferenceSession.OnnxValueMapType, inp: StepInputs, offset: number): Float32Array {
  for (let b = 0; b < rows.length; b++) kvs[b]!.len += rows[b]!.tokens.length;
  w.batch = { seqs: rows.map((r) => r.seq), past: presents(out), P: inp.T, mask: inp.mask, offset, shared: offset > 0 };
  return lastLogits(out.logits!, rows.length);
}

/** Whether a step's feeds hold a cache of no positions: its rows all start empty (a first prompt chunk on the CPU, kv-slots.ts). */
function readsNoCache(feeds: Record<string, ort.Tensor>): boolean {
  const past = feeds['cache.0.key'] ?? feeds['past_key_values.0.key'];
  return past?.dims[2] === 0;
}

/** Runs the model graph on a step of `tokens` tokens (rows x new tokens), on whichever session is faster for that size now. */
async function runModel(feeds: Record<string, ort.Tensor>, tokens: number): Promise<ort.InferenceSession.OnnxValueMapType> {
  // Every worker tells the others, a model with one session too: its steps take a core either way.
  const live = (w.slots ?? w.store).live;
  w.peers.stepping(live);
  if (!w.choice) {
    w.passes.wide++;
    return w.session!.run(feeds);
  }
  // The step's row length: input_ids [rows, longest row's new tokens].
  const kinds = sessionsFor(tokens, live, w.loaded, w.peers.crowded(), Number(feeds.input_ids?.dims[1] ?? tokens));
  const { out, kind } = await w.choice.run(tokens, kinds, (k) => w.byKind[k]!.run(feeds), readsNoCache(feeds));
  w.passes[kind]++;
  return out;
}

/** Runs the device-resident graph (kv-resident.ts): a GPU model's one session. */
function runResident(feeds: Record<string, ort.Tensor>): Promise<ort.InferenceSession.OnnxValueMapType> {
  w.peers.stepping(w.slots!.live);
  w.passes.wide++;
  return w.resident!.step.run(feeds);
}

/**
 * A step of the slot-cache graph: each row's cache read where it lies, only the step's new keys
 * and values written back; rows whose sequences keep their cache apart (kv-pools.ts) as a run of their own.
 */
async function slotStep(rows: StepRow[]): Promise<Float32Array> {
  if (w.slots instanceof ResidentSlots) return w.slots.step(rows, runResident);
  const runs = w.slots!.plan(rows);
  if (runs.length === 1) {
    const st = slotStepFeeds(runs[0]!.pool, rows);
    return slotStepDone(runs[0]!.pool, st, await runModel(st.feeds, st.order.length * st.S));
  }
  let logits: Float32Array | undefined;
  for (const run of runs) {
    const part = run.rows.map((i) => rows[i]!);
    const st = slotStepFeeds(run.pool, part);
    const out = slotStepDone(run.pool, st, await runModel(st.feeds, st.order.length * st.S));
    const V = out.length / part.length;
    logits ??= new Float32Array(rows.length * V);
    run.rows.forEach((i, b) => logits!.set(out.subarray(b * V, (b + 1) * V), i * V));
  }
  return logits!;
}

/** Whether a sequence has a cache here. */
function cached(seq: number): boolean {
  return w.slots ? w.slots.has(seq) : w.store.has(seq);
}

function kvBytes(): number {
  return (w.slots ? w.slots.bytes : w.store.bytes) + (w.arena?.bytes ?? 0);
}

/** One forward pass over a batch; rows that all continue one prefix go to the branch graph. */
function step(rows: StepRow[]): Promise<Float32Array> {
  return onDevice(() => stepHere(rows));
}

async function stepHere(rows: StepRow[]): Promise<Float32Array> {
  if (w.slots) return slotStep(rows);
  const shared = sharedRoot(rows);
  if (shared) return branchStep(rows, shared.root, shared.len);
  const steady = !!w.batch && !w.batch.shared && w.batch.seqs.length === rows.length && rows.every((r, b) => r.seq === w.batch!.seqs[b] && r.tokens.length === 1);
  if (!steady) materialize();
  const kvs = rows.map((r) => w.store.open(r.seq, Math.max(16, r.tokens.length)));
  const inp = stepInputs(rows, kvs, 0, w.arch.hasPositionIds, steady ? w.batch : undefined);
  return afterStep(rows, kvs, await runModel(inp.feeds, rows.length * (inp.T - inp.P)), inp, 0);
}

/**
 * The prefix every row continues (its root's first `len` positions, where the forks off the root
 * begin), when all rows are forks of one at one length and the model has a branch graph.
 */
function sharedRoot(rows: StepRow[]): { root: Kv; len: number } | undefined {
  if (!w.branchSession) return undefined;
  let shared: { root: Kv; len: number } | undefined;
  for (const r of rows) {
    let fork = w.store.get(r.seq);
    if (!fork?.base) return undefined;
    // The row's ancestor forked off the root: it says where the prefix ends.
    let root: Kv = fork.base;
    while (root.base) {
      fork = root;
      root = root.base;
    }
    if (shared && (root !== shared.root || fork.baseLen !== shared.len)) return undefined;
    shared = { root, len: fork.baseLen };
  }
  return shared;
}

/** The branch graph's `prefix_key_values` feeds: the root's first `Q` positions, built once for all the branch steps that read them. */
function prefixFeeds(root: Kv, Q: number): Record<string, ort.Tensor> {
  if (root.prefixFeeds?.len === Q) return root.prefixFeeds.feeds;
  const { layers, kvHeads: H, headDim: D } = w.arch;
  const feeds: Record<string, ort.Tensor> = {};
  for (let l = 0; l < layers; l++) {
    for (const which of ['key', 'value'] as const) {
      const buf = w.store.alloc(H * Q * D);
      for (let h = 0; h < H; h++) w.store.copySpan(root, l, which, h, 0, Q, buf, h * Q * D);
      feeds[`prefix_key_values.${l}.${which}`] = new ort.Tensor(w.arch.kvType, buf, [1, H, Q, D]);
    }
  }
  root.prefixFeeds = { len: Q, feeds };
  return feeds;
}

/**
 * A step of branches of one prefix, on the branch graph: the prefix goes in
 * once, and each row's past holds only its own positions after the prefix
 * (a question's tokens, when the row is one of its answer tokens).
 */
async function branchStep(rows: StepRow[], root: Kv, len: number): Promise<Float32Array> {
  // A branch step does not pass through runModel: it tells the peers it steps here (after a rest they saw none).
  w.peers.stepping(w.store.live);
  materialize();
  const kvs = rows.map((r) => w.store.get(r.seq)!);
  const inp = stepInputs(rows, kvs, len, true);
  Object.assign(inp.feeds, prefixFeeds(root, len));
  if (!w.branchChoice) {
    w.passes.wide++;
    return afterStep(rows, kvs, await w.branchSession!.run(inp.feeds), inp, len);
  }
  const tokens = rows.length * (inp.T - inp.P);
  const { out, kind } = await w.branchChoice.run(tokens, sessionsFor(tokens, rows.length, BRANCH_SESSIONS), (k) => (k === 'prefill' ? w.branchPrefill! : w.branchSession!).run(inp.feeds));
  w.passes[kind]++;
  return afterStep(rows, kvs, out, inp, len);
}

/** Each live generation's sampling state (generation.ts), by sequence. */
const samplers = new Map<number, Sampling>();

/**
 * Positions a sequence may still add to its cache: a generation feeds back each token it makes
 * but its last, so from any point it reaches its length + budget - made. A sequence without a
 * sampler (a prompt not yet whole) has no bound.
 */
function positionsLeft(seq: number): number | undefined {
  const sm = samplers.get(seq);
  return sm ? sm.budget - sm.made : undefined;
}

function startSampler(seq: number, spec: SamplerSpec): Sampling {
  const sm = startSampling(spec, w.maskers);
  samplers.set(seq, sm);
  return sm;
}

/** Rows that were to start from a kept generation and ran its tokens instead (StepRow.from), until their step's answer says so. */
const missedForks = new Set<number>();

/**
 * Starts the rows that open with another generation's positions (StepRow.from: a kept one, or one
 * still running) from a copy of them; where it is gone (or holds fewer), the row runs those tokens
 * first. Once per row: a shared step that failed runs its rows again, alone (runJoinGroup).
 */
function startFromKept(rows: StepRow[]): void {
  for (const r of rows) {
    const from = r.from;
    if (!from) continue;
    r.from = undefined;
    if (cached(r.seq)) throw new Error(`sequence ${r.seq} already holds a cache: it cannot start from sequence ${from.seq}'s`);
    const at = from.tokens.length;
    const kept = w.kept.get(from.seq);
    const pools = w.slots instanceof KvPools ? w.slots : undefined;
    if (!pools) missedForks.add(r.seq);
    else if (kept && kept.len >= at) pools.putIn(r.seq, kept, at, w.arena!);
    else if (pools.has(from.seq) && pools.len(from.seq) >= at) pools.copyOpening(from.seq, r.seq, at);
    else missedForks.add(r.seq);
    if (missedForks.has(r.seq)) r.tokens = [...from.tokens, ...r.tokens];
  }
}

/** A prompt step: rows that end a generation's prompt are sampled here; every row's logits go back too (scoring reads them). */
async function promptStep(rows: StepRow[]): Promise<{ logits: Float32Array; tokens: Int32Array; logprobs?: Array<TokenLogprob | null> }> {
  startFromKept(rows);
  const logits = await step(rows);
  const tokens = new Int32Array(rows.length).fill(-1);
  rows.forEach((r, b) => {
    if (r.sampler) tokens[b] = draw(startSampler(r.seq, r.sampler), logits, b, logits.length / rows.length);
  });
  return { logits, tokens, logprobs: logprobsOf(rows.map((r) => (r.sampler ? r.seq : -1))) };
}

/** Each row's last sampled token's logprob, or undefined when no row asked for them (the usual case: nothing sent). */
function logprobsOf(seqs: number[]): Array<TokenLogprob | null> | undefined {
  if (!seqs.some((seq) => samplers.get(seq)?.topLogprobs !== undefined)) return undefined;
  return seqs.map((seq) => samplers.get(seq)?.lastLogprob ?? null);
}


/** A prompt step whose answer goes back as a `step` reply; the generations it starts are returned. */
async function replyStep(id: number, rows: StepRow[]): Promise<number[]> {
  const out = await promptStep(rows);
  // The decode run's held tokens first: the main thread reads every message in the worker's order.
  w.tokenPosts?.flush();
  postStep(id, rows, out.logits, out.tokens, out.logprobs, rows.length);
  return startedBy(rows);
}

/** Posts a prompt step's answer for one request (its rows' logits, tokens and logprobs); `rowsInStep` as protocol.ts says. */
function postStep(id: number, rows: StepRow[], logits: Float32Array, tokens: Int32Array, logprobs: Array<TokenLogprob | null> | undefined, rowsInStep: number): void {
  const missed = missedForks.size ? rows.filter((r) => missedForks.delete(r.seq)).map((r) => r.seq) : [];
  port.postMessage(
    { type: 'step', id, logits, tokens, kvBytes: kvBytes(), passes: w.passes, logprobs, rowsInStep, ...(missed.length ? { missed } : {}) } satisfies WorkerEvent,
    [logits.buffer as ArrayBuffer, tokens.buffer as ArrayBuffer],
  );
}

/** The generations a prompt step starts: its rows that carried a sampler. */
const startedBy = (rows: StepRow[]): number[] => rows.filter((r) => r.sampler).map((r) => r.seq);

/**
 * Prompts that arrived during a decode run: run here, between two of its
 * steps, with no round trip to the main thread; their generations join the run.
 */
const joins: Array<Extract<WorkerCommand, { type: 'join' }>> = [];

/** Runs one join alone; a join that fails is answered with its error (the run goes on). */
async function runJoin(j: Extract<WorkerCommand, { type: 'join' }>): Promise<number[]> {
  try {
    return await replyStep(j.id, j.rows);
  } catch (e) {
    w.tokenPosts?.flush();
    port.postMessage({ type: 'error', id: j.id, message: (e as Error).message } satisfies WorkerEvent);
    return [];
  }
}

/**
 * Runs the pending joins, those that arrived during the same step in one step where they fit
 * InitMsg.joinedStepTokensMax: a step costs per row far less at a few rows than at one, and on a GPU
 * a step costs about the same whatever its rows (bench/README.md "Prompts join the decode run").
 * Each join is answered on its own; a shared step that fails runs its joins alone, so each
 * gets its own answer or error. Returns the generations started.
 */
async function runJoins(): Promise<number[]> {
  const started: number[] = [];
  // Joins that arrive during these steps wait for the next turn of the outer loop.
  while (joins.length) {
    const groups = inStepBudget(joins.splice(0), (j) => j.rows.length, (j) => Math.max(...j.rows.map((r) => r.tokens.length)), w.joinedStepTokensMax);
    for (const group of groups) started.push(...(await runJoinGroup(group)));
  }
  return started;
}

/** One step of joins that fit it together (runJoins); returns the generations started. */
async function runJoinGroup(group: Array<Extract<WorkerCommand, { type: 'join' }>>): Promise<number[]> {
  if (group.length === 1) return runJoin(group[0]!);
  let out: Awaited<ReturnType<typeof promptStep>>;
  try {
    out = await promptStep(group.flatMap((j) => j.rows));
  } catch {
    const started: number[] = [];
    for (const j of group) started.push(...(await runJoin(j)));
    return started;
  }
  w.tokenPosts?.flush();
  const rows = group.reduce((n, j) => n + j.rows.length, 0);
  const V = out.logits.length / rows;
  let b = 0;
  for (const j of group) {
    const n = j.rows.length;
    postStep(j.id, j.rows, out.logits.slice(b * V, (b + n) * V), out.tokens.slice(b, b + n), out.logprobs?.slice(b, b + n), b === 0 ? rows : 0);
    b += n;
  }
  return group.flatMap((j) => startedBy(j.rows));
}

/** Decodes `seqs` until each has ended or been freed, the main thread interrupts, or `stepsMax` steps ran; posts each step's tokens. */
async function decodeRun(id: number, seqs: number[], stepsMax: number): Promise<void> {
  w.inRun = true;
  w.runsQueued--;
  // Commands that came while other work held the thread (a prompt's step before this run) are
  // read now, not by the event loop after the first step has started: a join among them runs at
  // the run's first step. Posted together with the run, a join was read at once only where the
  // thread took both messages in one turn, which a busy machine does not promise.
  readCommandsNow();
  const alive = (seq: number) => cached(seq) && samplers.get(seq)?.ended === false;
  let live = seqs.filter(alive);
  const posts = (w.tokenPosts = new TokenPosts((steps) => port.postMessage({ type: 'tokens', id, steps } satisfies WorkerEvent), w.tokensPostIntervalMs));
  try {
    // An interrupt or a close ends the run after its current step: one that came before the run
    // began, after its first (the scheduler takes a run of no step for a fault, not a shutdown).
    for (let steps = 0; (steps === 0 || (w.interruptedRun !== id && !w.closeRequested)) && steps < stepsMax; steps++) {
      if (joins.length) for (const seq of await runJoins()) if (alive(seq) && !live.includes(seq)) live.push(seq);
      if (!live.length) break;
      const t0 = performance.now();
      const logits = await step(live.map((seq) => ({ seq, tokens: [samplers.get(seq)!.next] })));
      const V = logits.length / live.length;
      const tokens = Int32Array.from(live, (seq, b) => draw(samplers.get(seq)!, logits, b, V));
      // Copied, not transferred: a step's few tokens copy faster than a transfer detaches their buffer
      // (a 1-token message: ~36 us to post copied, ~60 us transferred, from a nice-10 worker here).
      const urgent = live.some((seq) => {
        const sm = samplers.get(seq)!;
        return sm.ended || sm.made <= TOKENS_POSTED_AT_ONCE;
      });
      // A copy: a held step must not see the joins later pushed onto `live`.
      posts.add({ seqs: live.slice(), tokens, logprobs: logprobsOf(live), madeAt: sharedNow(), stepMs: performance.now() - t0 }, urgent);
      readCommandsNow();
      applyDeferred();
      // A slot of a generation that ended here (end of text, max_tokens) is freed now, not when
      // the scheduler's free comes after the run: left in place it broke the run of consecutive
      // slots the next step's rows are fed from, and a swap moved it out of their way, copying
      // its keys and values three times.
      if (w.slots) freeEnded(live);
      live = live.filter(alive);
    }
    // Joins that came with the last step still get their answer; they decode in the next run.
    if (joins.length) await runJoins();
  } finally {
    posts.flush();
    w.tokenPosts = undefined;
    w.inRun = false;
    // Only when a step failed: its joins are answered with the failure too.
    for (const j of joins.splice(0)) port.postMessage({ type: 'error', id: j.id, message: 'the decode run failed' } satisfies WorkerEvent);
  }
}

// Frees and keeps that arrive while a step is in flight wait for it, in their order: the batch
// in the session's tensors must not change under a running step.
const deferred: Array<() => void> = [];
function applyDeferred(): void {
  for (const op of deferred.splice(0)) op();
}
/** Runs `op` now, or after the step in flight. */
const betweenSteps = (op: () => void): void => void (w.busy ? deferred.push(op) : op());

function fork(from: number, to: number[], at?: number): void {
  if (w.slots) throw new Error('this model graph keeps a slot cache, which does not fork: branches need the past_key_values layout of evaluation models');
  if (w.batch?.seqs.includes(from)) materialize();
  const src = w.store.get(from);
  if (!src) throw new Error(`fork: sequence ${from} has no cache`);
  if (at !== undefined && !(Number.isInteger(at) && at > 0 && at <= src.len)) throw new Error(`fork: sequence ${from} holds ${src.len} positions, not ${at}`);
  w.store.fork(src, to, at);
}

/** Frees (or keeps, for later prompts) the slots of those of `seqs` whose generation has ended (the scheduler's later free or keep of them finds nothing). */
function freeEnded(seqs: number[]): void {
  // Every step calls this, and a generation ends once in 64 steps or so: no array unless one did.
  if (!seqs.some((seq) => samplers.get(seq)?.ended)) return;
  const ended = seqs.filter((seq) => samplers.get(seq)?.ended);
  // Only what the scheduler may keep: a copy out of the slots costs ~10 ms for 55 MB (bench/README.md "Kept prompts").
  const kept = w.arch.keepsGenerations ? ended.filter((seq) => samplers.get(seq)!.keep && keptKvBytesOf(seq) <= w.keptBytesMax) : [];
  if (kept.length) keep(kept);
  if (kept.length < ended.length) free(ended.filter((seq) => !kept.includes(seq)));
}

/** The bytes a slot sequence's cache would take kept. */
const keptKvBytesOf = (seq: number): number => keptBytesOf((w.slots as KvPools).len(seq), kvBytesPerPosition(w.arch));

/** Sequences that generate no more and stay for later prompts (WorkerCommand `keep`): moved out of the slots. */
function keep(seqs: number[]): void {
  if (!(w.arch.keepsGenerations && w.slots instanceof KvPools)) return free(seqs); // nothing asks this of such a worker
  for (const s of seqs) {
    samplers.delete(s);
    const kept = w.slots.takeOut(s, w.arena!);
    if (kept) w.kept.set(s, kept);
  }
  w.peers.freed(w.slots.live);
  if (!w.slots.live) releaseSlotsWhenIdle();
}

function free(seqs: number[]): void {
  for (const s of seqs) {
    missedForks.delete(s);
    const kept = w.kept.get(s);
    if (kept) w.arena!.release(kept);
    w.kept.delete(s);
  }
  if (w.slots) {
    for (const s of seqs) if (w.slots.delete(s)) samplers.delete(s);
    w.peers.freed(w.slots.live);
    if (!w.slots.live) releaseSlotsWhenIdle();
    return;
  }
  if (w.batch && seqs.some((s) => w.batch!.seqs.includes(s))) materialize();
  for (const s of seqs) if (w.store.delete(s)) samplers.delete(s);
  w.peers.freed(w.store.live);
}

/** Decode steps of the warm-up: enough for the session choice's measuring bursts of every session at batch 1 (3 sessions x 2 bursts of 3). */
const WARM_UP_DECODE_STEPS = 24;
/**
 * ... of which the last this many are timed for admission (WarmPace): past the choice's measuring,
 * on the session chosen. A model with one session runs only these (a few ms for m25 int4).
 */
const WARM_UP_TIMED_STEPS = 8;
/**
 * Rows of the warm-up's timed batch (WarmPace.batch): a row costs much less in a batch than
 * alone (the weights are read once a step), so a pace taken at one row alone made admission
 * refuse a fresh model's queue that a full batch would start in time. 16: a step's time a row
 * near a full batch's (m110 int4: 0.024 ms a row-position at 16 rows, 0.014 at 64, 0.096 at
 * one), for a load time within its own spread (m110 int4: 8.9-11.8 s in three loads, 9.4-11.1
 * before).
 */
const WARM_UP_BATCH_ROWS = 16;
/** The warm-up's prompt, in tokens: a short chat prompt's size (the benchmarks' is 20). */
const WARM_UP_PROMPT_TOKENS = 20;
/**
 * Runs of it at most while the session choice measures its size (SessionChoice.measure): bursts
 * of 3 a session, the first of each not counted, until each has 4 counted (30 for five sessions;
 * m25 int4: ~0.2 s more at load).
 */
const WARM_UP_PROMPT_RUNS_MAX = 40;
/**
 * Runs a throwaway sequence through the model before it is reported ready, as llama.cpp's server
 * and vLLM do at start: a fresh daemon's first request took 30-34 ms to its first token and ran
 * at ~330 tokens/s where the following ones took ~10 ms and ~600 (m25 int4, one stream), paying
 * for each session's first runs, the slot cache's buffers and, with several sessions, the session
 * choice's measuring. Only a model with several sessions gains enough to be worth its start time:
 * a slot-cache one warms its decoding (tens of milliseconds), one with a prefill session its long
 * steps (warmUpLong: ~1.4 s more at load for m25 int4, ~2.2 s since the warm-up also measures the
 * sessions for a short prompt and a long one, 0.15-0.45 s more since it runs the long-step
 * session's longest step); its pass counts start from zero after it. Every
 * slot-cache model, a GPU's device cache too, times its short prompt and a few decode steps of one
 * row and of WARM_UP_BATCH_ROWS: admission's pace until its own steps are timed (throughput.ts StepPace).
 */
async function warmUp(positionsMax: number): Promise<WarmPace | undefined> {
  if (w.arch.vocab < 1) return undefined;
  try {
    const pace = w.slots ? await warmUpDecoding(positionsMax) : undefined;
    const long = w.choice && w.loaded.prefill ? await warmUpLong(positionsMax) : undefined;
    return pace && long ? { ...pace, long } : pace;
  } catch (e) {
    // Only the first requests' speed depends on it: a model that serves is served without it.
    port.postMessage({ type: 'warning', message: `warm-up not finished (${(e as Error).message}); the first requests measure the sessions` } satisfies WorkerEvent);
    return undefined;
  } finally {
    free([WARM_UP_SEQ]);
    w.passes = noPasses();
  }
}

/** The warm-up's throwaway sequence: the scheduler numbers sequences from 0. */
const WARM_UP_SEQ = -1;

async function warmUpDecoding(positionsMax: number): Promise<WarmPace | undefined> {
  const seq = WARM_UP_SEQ;
  // A model of a very short context warms up on what fits in it.
  const promptLen = Math.min(WARM_UP_PROMPT_TOKENS, Math.floor(positionsMax / 2));
  const steps = Math.min(w.choice ? WARM_UP_DECODE_STEPS : WARM_UP_TIMED_STEPS, positionsMax - promptLen);
  if (promptLen < 1) return undefined;
  const tokens = Array.from({ length: promptLen }, (_, i) => i % w.arch.vocab);
  if (w.choice && w.slots instanceof KvPools) {
    // The prompt's shape once on every session it may run on: onnxruntime plans its memory per shape and session.
    const { feeds } = slotStepFeeds(w.slots.near, [{ seq, tokens }]);
    const kinds = sessionsFor(promptLen, 1, w.loaded);
    for (const k of kinds) await w.byKind[k]!.run(feeds);
    // ... and measured on them until its session is chosen, as the first requests' prompts would be.
    await w.choice.measure(promptLen, kinds, WARM_UP_PROMPT_RUNS_MAX, (k) => w.byKind[k]!.run(feeds), Infinity, readsNoCache(feeds));
  }
  const t = performance.now();
  await slotStep([{ seq, tokens }]);
  const promptMs = performance.now() - t;
  const timed = (await timedDecodeSteps([seq], steps, tokens)).slice(-WARM_UP_TIMED_STEPS);
  free([seq]);
  if (!timed.length) return undefined;
  // The median step, at the timed steps' middle position (step i feeds position promptLen + i).
  const pace: WarmPace = { decodeStepMs: medianOf(timed), decodePosition: promptLen + steps - (timed.length + 1) / 2, promptTokens: promptLen, promptMs };
  // The same prompt in a batch of rows, then a few decode steps of them, timed.
  const batch = Array.from({ length: WARM_UP_BATCH_ROWS }, (_, r) => WARM_UP_SEQ - 1 - r);
  try {
    await slotStep(batch.map((s) => ({ seq: s, tokens })));
    const times = await timedDecodeSteps(batch, Math.min(WARM_UP_TIMED_STEPS, positionsMax - promptLen), tokens);
    if (times.length) pace.batch = { rows: batch.length, stepMs: medianOf(times), position: promptLen + (times.length - 1) / 2 };
  } finally {
    free(batch);
  }
  return pace;
}

/** Runs `steps` decode steps of `seqs`, each fed a token of `tokens`: each step's time, in order. */
async function timedDecodeSteps(seqs: number[], steps: number, tokens: number[]): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < steps; i++) {
    const t = performance.now();
    await slotStep(seqs.map((seq) => ({ seq, tokens: [tokens[i % tokens.length]!] })));
    times.push(performance.now() - t);
  }
  return times;
}

/**
 * A long prompt's tokens the warm-up runs once on every session a step of its size may run on,
 * where the model has a prefill session: vLLM's start-up runs its largest batch once too. A
 * session's first long steps allocate and first touch their buffers: in the daemon the prefill
 * session's first three 512-token steps of m25 int4 took 396, 319 and 370 ms and the next ones
 * 195-225, and those runs were the session choice's measurements (with it: 251, 286, 215).
 */
const WARM_UP_LONG_PROMPT_TOKENS = 512;
/**
 * Runs of it at most, until the session choice has chosen its size's session (SessionChoice.measure):
 * each session's first allocates, and the fastest needs 3 counted runs, 8 for three sessions
 * where the others are slower by 1.25x (m25 int4: ~0.5 s more at load).
 */
const WARM_UP_LONG_RUNS_MAX = 12;
/**
 * ... and milliseconds at most: a larger model's or a slower machine's long steps would hold its
 * start for long (m110 int4 on a 2-core AVX2 machine: 12 runs of 0.5-1.3 s, 10.3 s). What is
 * left unmeasured the first long requests measure, as before the warm-up measured them.
 */
const WARM_UP_LONG_MS_MAX = 4_000;

/**
 * A long prompt's step measured on the sessions it may run on (above); then one step of the
 * longest a step holds (InitMsg.stepTokensMax, within the context) on the long-step session, where
 * it loaded: its rows run there alone, so no measuring runs it, and its first step allocates and
 * first touches its buffers. After load the first 1,000-token prompt of m25 int4 took 502-717 ms
 * to its first token against 125-135 for the next ones, its step 334-369 ms against ~125
 * (bench/README.md "A long prompt after short ones").
 */
async function warmUpLong(positionsMax: number): Promise<WarmPace['long']> {
  if (w.slots instanceof ResidentSlots) return undefined; // a GPU model has no CPU sessions to choose between
  const len = Math.min(WARM_UP_LONG_PROMPT_TOKENS, positionsMax);
  const rows = [{ seq: WARM_UP_SEQ, tokens: Array.from({ length: len }, (_, i) => i % w.arch.vocab) }];
  const feeds = w.slots ? slotStepFeeds(w.slots.near, rows).feeds : stepInputs(rows, [w.store.open(WARM_UP_SEQ, len)], 0, w.arch.hasPositionIds).feeds;
  await w.choice!.measure(len, sessionsFor(len, 1, w.loaded), WARM_UP_LONG_RUNS_MAX, (k) => w.byKind[k]!.run(feeds), WARM_UP_LONG_MS_MAX, readsNoCache(feeds));
  const longest = Math.min(w.stepTokensMax, positionsMax);
  if (w.loaded.long && w.slots && longest >= LONG_SESSION_STEP_TOKENS_MIN) {
    // A cache of its own, of one slot, dropped after it: the model's cache would hold the memory of
    // its four slots of the whole context until idle.
    const cache = new KvSlots({ ...w.arch, positionsMax, emptyCacheFeeds: true }, 1);
    const { feeds } = slotStepFeeds(cache, [{ seq: WARM_UP_SEQ, tokens: Array.from({ length: longest }, (_, i) => i % w.arch.vocab) }]);
    const t = performance.now();
    await w.byKind.long!.run(feeds);
    return { tokens: longest, stepMs: performance.now() - t };
  }
  return undefined;
}

/** Runs `work` holding the webgpu device lock where this worker has one (device-lock.ts); elsewhere, as it is. */
function onDevice<T>(work: () => Promise<T>): Promise<T> {
  return w.device ? w.device.hold(work) : work();
}

// Model work runs one piece at a time, in arrival order; interrupts and
// frees act at once (frees wait for the step in flight, see above).
function serial(msg: WorkerCommand & { id: number }, work: () => Promise<void>): void {
  w.pending++;
  w.queue = w.queue.then(async () => {
    w.busy = true;
    try {
      await work();
    } catch (e) {
      port.postMessage({ type: 'error', id: msg.id, message: (e as Error).message } satisfies WorkerEvent);
    } finally {
      w.busy = false;
      applyDeferred();
      if (--w.pending === 0) restWhenIdle();
    }
  });
}

// A worker without work for a while is not busy for its peers (peers.ts), whatever it holds.
let restTimer: NodeJS.Timeout | undefined;
let idleSince = 0;
function restWhenIdle(): void {
  idleSince = performance.now();
  // One timer at a time: an armed one looks at the latest idleSince when it fires.
  if (!restTimer) restTimer = setTimeout(restIfStillIdle, PEERS_REST_AFTER_IDLE_MS).unref();
}
function restIfStillIdle(): void {
  restTimer = undefined;
  if (w.pending) return; // working again: its next drain arms the timer anew
  const left = idleSince + PEERS_REST_AFTER_IDLE_MS - performance.now();
  if (left > 0) restTimer = setTimeout(restIfStillIdle, left).unref();
  else w.peers.rest();
}

// The worker's own memory, for the engine's metrics: a soak showed RSS growing and the main
// thread's heap explains only part of it. Unref'd: it never keeps a closing worker alive.
// Started once init has made the cache: a load longer than one period (m110 int4 with its extra
// sessions on a busy 2-core machine) read a cache not yet made and crashed the worker.
const WORKER_MEMORY_REPORT_MS = 10_000;
function reportMemory(): void {
  const h = v8.getHeapStatistics();
  port.postMessage({ type: 'memory', heapUsedBytes: h.used_heap_size, externalBytes: h.external_memory, kvBytes: kvBytes() } satisfies WorkerEvent);
}

/**
 * How long an empty slot cache keeps its buffers: a request arriving within it starts with no
 * allocation (kv-slots.ts, KEPT_CAPACITY_MAX_POSITIONS); a model left idle gives its memory back.
 */
const KV_SLOTS_IDLE_RELEASE_MS = 10_000;
let releaseTimer: NodeJS.Timeout | undefined;
function releaseSlotsWhenIdle(): void {
  clearTimeout(releaseTimer);
  releaseTimer = setTimeout(() => {
    const released = w.device ? w.device.holdNow(() => w.slots?.release()) : w.slots?.release();
    if (released) reportMemory();
  }, KV_SLOTS_IDLE_RELEASE_MS).unref();
}

/**
 * The worker ends its own thread, from its JS and so between two onnxruntime calls. A
 * terminate() from the main thread can land inside one (a step's run, or a run on a session
 * just released), where onnxruntime-node's binding cannot throw into a stopping thread and
 * aborts the whole process: SIGABRT, "terminate called after throwing an instance of
 * 'Napi::Error'" (CI saw it at a shutdown; a scratch repro: 8 of 9 terminates of a
 * worker running steps in a loop). Nothing after this point runs: later messages are dropped.
 */
function endThread(code: number): never {
  process.exit(code);
}

/**
 * Handles the commands that came while a decode run's step ran, now, before its next step.
 * Left to the event loop they would be read in its next poll, which comes just before
 * onnxruntime's next run (each run is an immediate of its own): a prompt read then waited for
 * that whole step before it joined, and an interrupt let one more step run. At 16 streams of
 * m25 int4 a join's answer came ~1.5 steps after it was sent before this, ~0.5 after
 * (bench/README.md "Commands read between two steps").
 */
function readCommandsNow(): void {
  for (let m = receiveMessageOnPort(port); m; m = receiveMessageOnPort(port)) void onCommand(m.message as WorkerCommand);
}

port.on('message', onCommand);

async function onCommand(msg: WorkerCommand): Promise<void> {
  switch (msg.type) {
    case 'init':
      try {
        w.device = msg.deviceLock && new DeviceLock(msg.deviceLock);
        let pace: WarmPace | undefined;
        await onDevice(async () => {
          await init(msg);
          setInterval(reportMemory, WORKER_MEMORY_REPORT_MS).unref();
          pace = await warmUp(msg.positionsMax);
        });
        // A model the GPU provider could not take runs on the CPU (worker-sessions.ts): no device to share.
        if (w.arch.provider === 'cpu') w.device = undefined;
        port.postMessage({ type: 'ready', arch: w.arch, ...(pace ? { pace } : {}), sessions: w.loaded } satisfies WorkerEvent);
      } catch (e) {
        port.postMessage({ type: 'init-error', message: (e as Error).message } satisfies WorkerEvent);
      }
      return;
    case 'step':
      return serial(msg, async () => void (await replyStep(msg.id, msg.rows)));
    case 'join':
      if (w.inRun || w.runsQueued > 0) joins.push(msg);
      else serial(msg, async () => void (await replyStep(msg.id, msg.rows)));
      return;
    case 'decode':
      w.runsQueued++;
      return serial(msg, async () => {
        await decodeRun(msg.id, msg.seqs, msg.stepsMax);
        port.postMessage({ type: 'decode-done', id: msg.id, kvBytes: kvBytes(), passes: w.passes } satisfies WorkerEvent);
      });
    case 'interrupt':
      w.interruptedRun = msg.id;
      return;
    case 'fork':
      return serial(msg, async () => {
        fork(msg.from, msg.to, msg.at);
        port.postMessage({ type: 'done', id: msg.id } satisfies WorkerEvent);
      });
    case 'free':
      return betweenSteps(() => free(msg.seqs));
    case 'keep':
      return betweenSteps(() => keep(msg.seqs));
    case 'close':
      w.closeRequested = true;
      return serial(msg, async () => {
        try {
          await onDevice(async () => {
            // The device cache first: a gpu-buffer released after its session is gone crashes some onnxruntime-node builds.
            if (w.slots instanceof ResidentSlots) w.slots.dispose();
            for (const s of new Set([w.session, ...Object.values(w.byKind ?? {}), w.resident?.step, w.resident?.grow])) await s?.release();
            await w.branchSession?.release();
            await w.branchPrefill?.release();
          });
        } finally {
          endThread(0);
        }
      });
    case 'exit':
      return endThread(msg.code);
  }
}
