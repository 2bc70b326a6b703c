import { parentPort } from 'node:worker_threads';
import ort from 'onnxruntime-node';
import { WANT_LOGITS, WANT_LOGPROBS, type Arch, type FromWorker, type InitMsg, type StepMsg, type StepTimings, type ToWorker } from './protocol.js';

// One model's ONNX session (session.run blocks this thread, never the main
// one) and the KV cache of every live sequence.
//
// KV layout (optimum): past_key_values.N.key|value [batch, kvHeads, past, headDim].
// A sequence's KV lives in one of two places:
//  - the resident batch: the `present` tensors of the last step, [B, H, T, D],
//    with a 0/1 mask per row (left pads, and holes where a row had fewer new
//    tokens than the step's width). When the next step has exactly the same
//    rows (steady decoding), those tensors are fed back as the past unchanged:
//    no copy of the KV on our side, as in a plain ORT loop.
//  - detached: compact [H, len, D] arrays per layer, immutable, shared by
//    reference between forks (scoring branches fork a prefix for free).
// When the rows change (a sequence joins, leaves or pauses) the past is
// rebuilt once: resident rows are copied as whole blocks when the layout can
// be kept, or compacted run by run when pads would waste too much.
// A step whose rows are all outside a live resident batch (a prefill next to
// running decodes) runs as a side batch and leaves the resident one alone.
//
// This file imports only ./protocol.js at run time (see runner.ts: under
// vitest both are transpiled into dist/ on demand).

const port = parentPort!;

type KvArray = Float32Array | Uint16Array;

interface Detached {
  len: number;
  k: KvArray[];
  v: KvArray[];
  refs: number;
  bytes: number;
}

interface SeqKv {
  /** Real tokens in the cache (also the position id of the next token). */
  len: number;
  /** Row in the resident batch, or -1. */
  row: number;
  det: Detached | null;
}

interface Resident {
  /** Sequence id per row; -1 for a row whose sequence was freed. */
  seqs: number[];
  B: number;
  T: number;
  /** [B, T] attention mask of the cache, in the model's mask type. */
  mask: BigInt64Array;
  k: ort.Tensor[];
  v: ort.Tensor[];
  alive: number;
  bytes: number;
}

interface Names {
  ids: string;
  mask: string;
  pos: string | undefined;
  useCacheBranch: string | undefined;
  pastK: string[];
  pastV: string[];
  presentK: string[];
  presentV: string[];
  logits: string;
  maskInt32: boolean;
  idsInt32: boolean;
}

let session: ort.InferenceSession;
let arch: Arch;
let names: Names;
let wasteMax = 0.25;
const seqs = new Map<number, SeqKv>();
let resident: Resident | null = null;
let detachedBytes = 0;
const QUIET: ort.InferenceSession.RunOptions = { logSeverityLevel: 4 };

const elemBytes = () => (arch.kvType === 'float16' ? 2 : 4);
const alloc = (n: number): KvArray => (arch.kvType === 'float16' ? new Uint16Array(n) : new Float32Array(n));
const kvTensor = (data: KvArray, dims: number[]) => new ort.Tensor(arch.kvType, data, dims);

let halfTable: Float32Array | undefined;
function half(): Float32Array {
  if (halfTable) return halfTable;
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1;
    const e = (h >> 10) & 0x1f;
    const f = h & 0x3ff;
    t[h] = e === 0 ? s * 2 ** -14 * (f / 1024) : e === 31 ? (f ? NaN : s * Infinity) : s * 2 ** (e - 15) * (1 + f / 1024);
  }
  return (halfTable = t);
}

// ---------------------------------------------------------------- init

async function createSession(msg: InitMsg): Promise<{ provider: Arch['provider']; warning?: string }> {
  const base: ort.InferenceSession.SessionOptions = {
    graphOptimizationLevel: 'all',
    intraOpNumThreads: msg.intraOpThreads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    logSeverityLevel: 3,
  };
  try {
    session = await ort.InferenceSession.create(msg.modelPath, { ...base, executionProviders: [msg.executionProvider] });
    return { provider: msg.executionProvider };
  } catch (e) {
    if (msg.executionProvider === 'cpu' || msg.executionProviderStrict) throw e;
    session = await ort.InferenceSession.create(msg.modelPath, { ...base, executionProviders: ['cpu'] });
    return { provider: 'cpu', warning: `execution provider ${msg.executionProvider} failed (${(e as Error).message.split('\n')[0]}); running on cpu` };
  }
}

function readNames(): Names {
  const ins = new Map(session.inputMetadata.map((m) => [m.name, m]));
  const outs = new Set(session.outputNames);
  const pastK: string[] = [];
  const pastV: string[] = [];
  const presentK: string[] = [];
  const presentV: string[] = [];
  for (let l = 0; ins.has(`past_key_values.${l}.key`); l++) {
    pastK.push(`past_key_values.${l}.key`);
    if (!ins.has(`past_key_values.${l}.value`)) throw new Error(`input past_key_values.${l}.value missing`);
    pastV.push(`past_key_values.${l}.value`);
    const pre = ['present', 'present_key_values'].find((p) => outs.has(`${p}.${l}.key`) && outs.has(`${p}.${l}.value`));
    if (!pre) throw new Error(`output present.${l}.key|value missing`);
    presentK.push(`${pre}.${l}.key`);
    presentV.push(`${pre}.${l}.value`);
  }
  if (pastK.length === 0) throw new Error('no past_key_values.N.key inputs: not a decoder with a KV cache in the optimum layout');
  for (const n of ['input_ids', 'attention_mask']) if (!ins.has(n)) throw new Error(`input ${n} missing`);
  if (!outs.has('logits')) throw new Error('output logits missing');
  const type = (n: string) => (ins.get(n) as ort.InferenceSession.TensorValueMetadata | undefined)?.type;
  return {
    ids: 'input_ids',
    mask: 'attention_mask',
    pos: ins.has('position_ids') ? 'position_ids' : undefined,
    useCacheBranch: ins.has('use_cache_branch') ? 'use_cache_branch' : undefined,
    pastK,
    pastV,
    presentK,
    presentV,
    logits: 'logits',
    maskInt32: type('attention_mask') === 'int32',
    idsInt32: type('input_ids') === 'int32',
  };
}

async function init(msg: InitMsg): Promise<string | undefined> {
  wasteMax = msg.kvPadWasteRatioMax;
  const { provider, warning } = await createSession(msg);
  names = readNames();
  const k0 = session.inputMetadata.find((m) => m.name === names.pastK[0]) as ort.InferenceSession.TensorValueMetadata;
  const shape = k0.shape;
  if (shape.length !== 4 || typeof shape[1] !== 'number' || typeof shape[3] !== 'number') {
    throw new Error(`unsupported KV layout ${JSON.stringify(shape)} for ${k0.name}: expected [batch, kv_heads, past, head_dim]`);
  }
  if (k0.type !== 'float32' && k0.type !== 'float16') throw new Error(`unsupported KV type ${k0.type}`);
  const lm = session.outputMetadata.find((m) => m.name === 'logits') as ort.InferenceSession.TensorValueMetadata;
  if (lm.type !== 'float32' && lm.type !== 'float16') throw new Error(`unsupported logits type ${lm.type}`);
  arch = {
    layers: names.pastK.length,
    kvHeads: shape[1],
    headDim: shape[3],
    kvType: k0.type,
    logitsType: lm.type,
    vocab: typeof lm.shape[2] === 'number' ? lm.shape[2] : 0,
    hasPositionIds: names.pos !== undefined,
    multiTokenWithPast: false,
    provider,
  };
  // Warm-up (first runs are slow) and the vocabulary size when the graph leaves it symbolic.
  const first = await session.run(feeds(1, 1, [0], [0], new BigInt64Array([1n]), emptyPast(1), 0));
  arch.vocab = Number(first[names.logits]!.dims[2]);
  // Probe: can this graph run several new tokens after a non-empty past?
  const past: Record<string, ort.Tensor> = {};
  for (let l = 0; l < arch.layers; l++) {
    past[names.pastK[l]!] = first[names.presentK[l]!]!;
    past[names.pastV[l]!] = first[names.presentV[l]!]!;
  }
  try {
    await session.run(feeds(1, 2, [0, 0], [1, 2], new BigInt64Array([1n, 1n, 1n]), past, 1), QUIET);
    arch.multiTokenWithPast = true;
  } catch {
    arch.multiTokenWithPast = false;
  }
  await session.run(feeds(1, 1, [0], [1], new BigInt64Array([1n, 1n]), past, 1));
  return warning;
}

function emptyPast(B: number): Record<string, ort.Tensor> {
  const f: Record<string, ort.Tensor> = {};
  for (let l = 0; l < arch.layers; l++) {
    f[names.pastK[l]!] = kvTensor(alloc(0), [B, arch.kvHeads, 0, arch.headDim]);
    f[names.pastV[l]!] = kvTensor(alloc(0), [B, arch.kvHeads, 0, arch.headDim]);
  }
  return f;
}

function feeds(B: number, S: number, ids: number[] | BigInt64Array, pos: number[] | BigInt64Array, mask: BigInt64Array, past: Record<string, ort.Tensor>, P: number): Record<string, ort.Tensor> {
  const T = P + S;
  const i64 = (a: number[] | BigInt64Array) => (a instanceof BigInt64Array ? a : BigInt64Array.from(a, (x) => BigInt(x)));
  const asType = (a: BigInt64Array, int32: boolean, dims: number[]) =>
    int32 ? new ort.Tensor('int32', Int32Array.from(a, (x) => Number(x)), dims) : new ort.Tensor('int64', a, dims);
  const f: Record<string, ort.Tensor> = {
    ...past,
    [names.ids]: asType(i64(ids), names.idsInt32, [B, S]),
    [names.mask]: asType(mask, names.maskInt32, [B, T]),
  };
  if (names.pos) f[names.pos] = new ort.Tensor('int64', i64(pos), [B, S]);
  if (names.useCacheBranch) f[names.useCacheBranch] = new ort.Tensor('bool', [P > 0], [1]);
  return f;
}

// ---------------------------------------------------------------- KV moves

/** Runs [start, end) of ones in a mask row. */
function runsOf(mask: BigInt64Array, off: number, T: number): number[] {
  const runs: number[] = [];
  let t = 0;
  while (t < T) {
    while (t < T && mask[off + t] === 0n) t++;
    const a = t;
    while (t < T && mask[off + t] !== 0n) t++;
    if (t > a) runs.push(a, t);
  }
  return runs;
}

/** Copies the real positions of row r of [B, H, T, D] `src` into [*, H, P, D] `dst` row i, ending at P (left-padded). */
function copyCompact(src: KvArray, r: number, T: number, runs: number[], dst: KvArray, i: number, P: number, len: number): void {
  const { kvHeads: H, headDim: D } = arch;
  for (let h = 0; h < H; h++) {
    const s0 = (r * H + h) * T;
    let d = ((i * H + h) * P + P - len) * D;
    for (let j = 0; j < runs.length; j += 2) {
      const a = runs[j]!;
      const b = runs[j + 1]!;
      dst.set(src.subarray((s0 + a) * D, (s0 + b) * D), d);
      d += (b - a) * D;
    }
  }
}

function newDetached(len: number): Detached {
  const n = arch.kvHeads * len * arch.headDim;
  const bytes = 2 * arch.layers * n * elemBytes();
  return { len, k: Array.from({ length: arch.layers }, () => alloc(n)), v: Array.from({ length: arch.layers }, () => alloc(n)), refs: 0, bytes };
}

function hold(d: Detached): Detached {
  if (d.refs++ === 0) detachedBytes += d.bytes;
  return d;
}

function release(d: Detached | null): void {
  if (d && --d.refs === 0) detachedBytes -= d.bytes;
}

/** A compact copy of row r of a [B, H, T, D] batch (mask `mask`). */
function detachRow(k: ort.Tensor[], v: ort.Tensor[], mask: BigInt64Array, r: number, T: number, len: number): Detached {
  const d = newDetached(len);
  const runs = runsOf(mask, r * T, T);
  for (let l = 0; l < arch.layers; l++) {
    copyCompact(k[l]!.data as KvArray, r, T, runs, d.k[l]!, 0, len, len);
    copyCompact(v[l]!.data as KvArray, r, T, runs, d.v[l]!, 0, len, len);
  }
  return d;
}

function residentBytes(B: number, T: number): number {
  return 2 * arch.layers * B * arch.kvHeads * T * arch.headDim * elemBytes();
}

function dropResident(): void {
  resident = null;
}

// ---------------------------------------------------------------- step

async function step(msg: StepMsg): Promise<{ logits: Float32Array; timings: StepTimings }> {
  const t0 = performance.now();
  const B = msg.seqs.length;
  const { layers, kvHeads: H, headDim: D } = arch;
  const st: SeqKv[] = new Array(B);
  let S = 0;
  let inR = 0;
  for (let i = 0; i < B; i++) {
    const id = msg.seqs[i]!;
    let s = seqs.get(id);
    if (!s) seqs.set(id, (s = { len: 0, row: -1, det: null }));
    st[i] = s;
    if (s.row >= 0) inR++;
    if (msg.counts[i]! > S) S = msg.counts[i]!;
  }
  if (S === 0) throw new Error('step with no tokens');
  const R = resident;
  let mode: StepTimings['mode'];
  if (R && inR === B && B === R.B && R.seqs.every((id, i) => id === msg.seqs[i])) mode = 'reuse';
  else if (inR === 0) mode = R && R.alive > 0 ? 'side' : 'fresh';
  else mode = 'rebuild';
  if (mode === 'fresh' && R) dropResident();
  if (!arch.multiTokenWithPast && S > 1) {
    for (const s of st) if (s.len > 0) throw new Error('this model runs several new tokens only from an empty past');
  }

  // ---- past KV and its mask
  let P: number;
  let pastMask: BigInt64Array;
  let pastK: ort.Tensor[];
  let pastV: ort.Tensor[];
  if (mode === 'reuse') {
    P = R!.T;
    pastMask = R!.mask;
    pastK = R!.k;
    pastV = R!.v;
  } else {
    if (mode === 'rebuild') {
      // Resident rows that sit out this step keep their KV, detached.
      const inStep = new Set(msg.seqs);
      R!.seqs.forEach((id, r) => {
        if (id < 0 || inStep.has(id)) return;
        const s = seqs.get(id)!;
        s.det = hold(detachRow(R!.k, R!.v, R!.mask, r, R!.T, s.len));
        s.row = -1;
      });
    }
    let maxLen = 0;
    let maxOut = 0;
    let sumLen = 0;
    for (const s of st) {
      maxLen = Math.max(maxLen, s.len);
      if (s.row < 0) maxOut = Math.max(maxOut, s.len);
      sumLen += s.len;
    }
    P = maxLen;
    let keep = false;
    if (mode === 'rebuild' && maxOut <= R!.T) {
      const waste = (B * R!.T - sumLen) / (B * R!.T);
      if (waste <= wasteMax || R!.T === maxLen) {
        P = R!.T;
        keep = true;
      }
    }
    pastMask = new BigInt64Array(B * P);
    const pk = Array.from({ length: layers }, () => alloc(B * H * P * D));
    const pv = Array.from({ length: layers }, () => alloc(B * H * P * D));
    const rowBlock = H * P * D;
    for (let i = 0; i < B; i++) {
      const s = st[i]!;
      if (s.row >= 0) {
        const T = R!.T;
        if (keep) {
          for (let l = 0; l < layers; l++) {
            pk[l]!.set((R!.k[l]!.data as KvArray).subarray(s.row * rowBlock, (s.row + 1) * rowBlock), i * rowBlock);
            pv[l]!.set((R!.v[l]!.data as KvArray).subarray(s.row * rowBlock, (s.row + 1) * rowBlock), i * rowBlock);
          }
          pastMask.set(R!.mask.subarray(s.row * T, (s.row + 1) * T), i * P);
          continue;
        }
        const runs = runsOf(R!.mask, s.row * T, T);
        for (let l = 0; l < layers; l++) {
          copyCompact(R!.k[l]!.data as KvArray, s.row, T, runs, pk[l]!, i, P, s.len);
          copyCompact(R!.v[l]!.data as KvArray, s.row, T, runs, pv[l]!, i, P, s.len);
        }
      } else if (s.det) {
        const len = s.len;
        for (let l = 0; l < layers; l++) {
          for (let h = 0; h < H; h++) {
            const d = ((i * H + h) * P + P - len) * D;
            pk[l]!.set(s.det.k[l]!.subarray(h * len * D, (h + 1) * len * D), d);
            pv[l]!.set(s.det.v[l]!.subarray(h * len * D, (h + 1) * len * D), d);
          }
        }
      }
      pastMask.fill(1n, i * P + P - s.len, (i + 1) * P);
    }
    pastK = pk.map((a) => kvTensor(a, [B, H, P, D]));
    pastV = pv.map((a) => kvTensor(a, [B, H, P, D]));
  }

  // ---- new tokens: left-padded to the step width S
  const T = P + S;
  const ids = new BigInt64Array(B * S);
  const pos = new BigInt64Array(B * S);
  const mask = new BigInt64Array(B * T);
  let k = 0;
  for (let i = 0; i < B; i++) {
    const n = msg.counts[i]!;
    const len = st[i]!.len;
    if (P > 0) mask.set(pastMask.subarray(i * P, (i + 1) * P), i * T);
    const off = S - n;
    for (let j = 0; j < n; j++) {
      ids[i * S + off + j] = BigInt(msg.tokens[k++]!);
      pos[i * S + off + j] = BigInt(len + j);
    }
    mask.fill(1n, i * T + P + off, (i + 1) * T);
  }
  const past: Record<string, ort.Tensor> = {};
  for (let l = 0; l < layers; l++) {
    past[names.pastK[l]!] = pastK[l]!;
    past[names.pastV[l]!] = pastV[l]!;
  }
  const f = feeds(B, S, ids, pos, mask, past, P);
  const t1 = performance.now();
  const out = await session.run(f);
  const t2 = performance.now();

  // ---- KV after the step
  const newK = names.presentK.map((n) => out[n]!);
  const newV = names.presentV.map((n) => out[n]!);
  for (let i = 0; i < B; i++) st[i]!.len += msg.counts[i]!;
  if (mode === 'side') {
    for (let i = 0; i < B; i++) {
      const s = st[i]!;
      const d = hold(detachRow(newK, newV, mask, i, T, s.len));
      release(s.det);
      s.det = d;
    }
  } else {
    resident = { seqs: Array.from(msg.seqs), B, T, mask, k: newK, v: newV, alive: B, bytes: residentBytes(B, T) };
    for (let i = 0; i < B; i++) {
      const s = st[i]!;
      s.row = i;
      release(s.det);
      s.det = null;
    }
  }

  // ---- logits of the last position of the rows that asked
  const lt = out[names.logits]!;
  const V = arch.vocab;
  let nWant = 0;
  let allLogits = true;
  for (let i = 0; i < B; i++) {
    if (msg.want[i]) nWant++;
    if (msg.want[i] !== WANT_LOGITS) allLogits = false;
  }
  let logits: Float32Array;
  const data = lt.data as Float32Array | Uint16Array;
  if (allLogits && S === 1 && data instanceof Float32Array && data.byteOffset === 0 && data.byteLength === data.buffer.byteLength) {
    logits = data; // exactly [B, 1, V]: handed over without a copy
  } else {
    logits = new Float32Array(nWant * V);
    const tbl = data instanceof Uint16Array ? half() : undefined;
    let o = 0;
    for (let i = 0; i < B; i++) {
      const w = msg.want[i];
      if (!w) continue;
      const from = (i * S + S - 1) * V;
      if (tbl) for (let x = 0; x < V; x++) logits[o + x] = tbl[data[from + x]!]!;
      else logits.set((data as Float32Array).subarray(from, from + V), o);
      if (w === WANT_LOGPROBS) logSoftmaxInPlace(logits, o, V);
      o += V;
    }
  }
  const t3 = performance.now();
  return { logits, timings: { prepMs: t1 - t0, runMs: t2 - t1, postMs: t3 - t2, mode } };
}

function logSoftmaxInPlace(a: Float32Array, off: number, n: number): void {
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (a[off + i]! > max) max = a[off + i]!;
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(a[off + i]! - max);
  const lse = max + Math.log(sum);
  for (let i = 0; i < n; i++) a[off + i] = a[off + i]! - lse;
}

function fork(from: number, to: number[]): void {
  const s = seqs.get(from);
  if (!s) throw new Error(`fork: sequence ${from} has no cache`);
  const det = s.row >= 0 ? detachRow(resident!.k, resident!.v, resident!.mask, s.row, resident!.T, s.len) : s.det;
  for (const t of to) {
    if (seqs.has(t)) throw new Error(`fork: sequence ${t} exists`);
    seqs.set(t, { len: s.len, row: -1, det: det ? hold(det) : null });
  }
}

function free(ids: number[]): void {
  for (const id of ids) {
    const s = seqs.get(id);
    if (!s) continue;
    seqs.delete(id);
    release(s.det);
    if (s.row >= 0 && resident) {
      resident.seqs[s.row] = -1;
      if (--resident.alive === 0) dropResident();
    }
  }
}

const kvBytes = () => detachedBytes + (resident ? resident.bytes : 0);

// ---------------------------------------------------------------- messages

function reply(m: FromWorker, transfer: ArrayBuffer[] = []): void {
  try {
    port.postMessage(m, transfer);
  } catch {
    port.postMessage(m); // a buffer that cannot be transferred is copied
  }
}

async function handle(msg: ToWorker): Promise<void> {
  switch (msg.type) {
    case 'init':
      try {
        const warning = await init(msg);
        reply({ type: 'ready', arch, warning });
      } catch (e) {
        reply({ type: 'init-error', message: (e as Error).message });
      }
      return;
    case 'step':
      try {
        const { logits, timings } = await step(msg);
        reply({ type: 'step', id: msg.id, logits, kvBytes: kvBytes(), timings }, [logits.buffer as ArrayBuffer]);
      } catch (e) {
        // A failed step leaves its sequences' caches unknown: the scheduler fails and frees them.
        reply({ type: 'error', id: msg.id, message: (e as Error).message });
      }
      return;
    case 'fork':
      try {
        fork(msg.from, msg.to);
      } catch (e) {
        reply({ type: 'error', id: -1, message: (e as Error).message });
      }
      return;
    case 'free':
      free(msg.seqs);
      return;
    case 'close':
      seqs.clear();
      resident = null;
      await session?.release().catch(() => undefined);
      reply({ type: 'closed', id: msg.id });
      return;
  }
}

// Messages are handled one at a time, in order: a free or fork sent while a
// step runs applies after it.
let chain: Promise<void> = Promise.resolve();
port.on('message', (msg: ToWorker) => {
  chain = chain.then(() => handle(msg));
});
