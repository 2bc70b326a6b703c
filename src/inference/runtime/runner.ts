import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { log } from '../../log.js';
import { exitUnderway, holdExitFor } from '../../threads-at-exit.js';
import type { TokenLogprob } from '../engine-api.js';
import { releaseDeviceLockOf } from './device-lock.js';
import { engineMetrics as M } from './metrics.js';
import { WorkerPeers } from './peers.js';
import { noPasses, type Arch, type InitMsg, type ModelPasses, type WorkerEvent, type WorkerCommand, type StepRow, type WarmPace } from './protocol.js';
import type { LoadedSessions } from './session-choice.js';

/** A prompt step's answer: every row's last-position logits; sampled rows' tokens (-1 for the others) and logprobs when asked. */
export interface StepResult {
  logits: Float32Array;
  tokens: Int32Array;
  logprobs?: Array<TokenLogprob | null>;
  /** Rows of the step these rows ran in; 0 where joins shared a step and another reply counted it (protocol.ts). */
  rowsInStep: number;
  /** Rows (sequences) that were to start from a kept generation and ran its tokens instead (protocol.ts StepRow.from). */
  missed?: number[];
}
/**
 * One decode-run step: the token (and, when asked, logprob) of each sequence that ran; `madeAt`: when the worker sampled them, on this thread's
 * performance.now() clock; `stepMs`: the step's own time in the worker.
 */
export type OnTokens = (seqs: number[], tokens: Int32Array, logprobs: Array<TokenLogprob | null> | undefined, madeAt: number, stepMs: number) => void;

/** The model's worker died (an uncaught error, an exit): what it held is gone. */
export class WorkerLost extends Error {}

/** The runner was closed (the engine shuts down): a call after that fails with this and never reaches the worker. */
export class RunnerClosed extends Error {}

/**
 * A worker that dies is restarted, at most this many times within
 * WORKER_RESTART_WINDOW_MS: past that it is a crash loop, and the model stays
 * down (its requests answer 503) instead of burning a core on reloads.
 */
const WORKER_RESTARTS_MAX = 3;
const WORKER_RESTART_WINDOW_MS = 60_000;

/**
 * The main-thread side of a model's worker. Calls are serialised by the
 * scheduler (one step or decode run in flight per model); replies match by id.
 * A worker that dies fails what it was running (`onLost`) and is started again
 * from the same init message; calls made meanwhile wait for it.
 */
export class Runner {
  private worker: Worker | undefined;
  private nextId = 1;
  private readonly pending = new Map<number, { ok: (r: WorkerEvent) => void; fail: (e: Error) => void }>();
  private readonly onTokens = new Map<number, OnTokens>();
  arch!: Arch;
  /** The first worker's warm-up, timed (absent where it ran none): admission's pace until the model's own steps are measured. */
  warmPace: WarmPace | undefined;
  /** Which of the extra sessions the last worker loaded (worker-sessions.ts), for the load's log line and tests. */
  sessions: LoadedSessions | undefined;
  kvBytes = 0;
  /** Set by the scheduler: every sequence the dead worker held must end as failed. */
  onLost: ((e: WorkerLost) => void) | undefined;
  private restarting: Promise<void> | undefined;
  private down: WorkerLost | undefined;
  private readonly restarts: number[] = [];
  private closing = false;
  private stopped: Promise<void> | undefined;
  /** The decode run sent last and not yet answered: what interrupt() ends. */
  private decoding: number | undefined;

  /** Its metrics' labels: a model's replicas (replicas.ts) fold into one series (metrics.ts). */
  readonly labels: { model: string; replica: number };

  private constructor(
    private readonly init: Omit<InitMsg, 'type'>,
    private readonly modelId: string,
    replica: number,
  ) {
    this.labels = { model: modelId, replica };
  }

  /** `replica`: which of the model's workers this is (replicas.ts), 0 for a model's only one. */
  static async start(init: Omit<InitMsg, 'type'>, modelId: string, replica = 0): Promise<Runner> {
    const r = new Runner(init, modelId, replica);
    r.arch = await r.spawn();
    // Up: with replicas the gauge folds them (a model is down when every one is), so each says so.
    M.modelDown.set(r.labels, false);
    return r;
  }

  private async spawn(): Promise<Arch> {
    this.passesSeen = noPasses(); // a new worker counts from zero
    // A process on its way out starts no model worker: it could be cut inside its first session's creation.
    if (exitUnderway()) throw this.closed();
    const worker = new Worker(workerPath());
    // A worker that ends holding the webgpu device lock (a crash, an exit mid-step) must not leave the others waiting on it.
    const [lockCell, holder] = [this.init.deviceLock, worker.threadId];
    const freeDeviceLock = () => lockCell && releaseDeviceLockOf(lockCell, holder);
    worker.once('exit', freeDeviceLock);
    // An exit that skips the shutdown waits for it to end itself at the end of its step in flight
    // or of its loading's current call (threads-at-exit.ts).
    holdExitFor(worker, () => worker.postMessage({ type: 'exit', code: 0 } satisfies WorkerCommand));
    const init = this.init;
    const arch = await new Promise<Arch>((resolve, reject) => {
      const onMsg = (m: WorkerEvent) => {
        if (m.type === 'ready') {
          worker.off('message', onMsg);
          this.warmPace ??= m.pace;
          this.sessions = m.sessions;
          resolve(m.arch);
        } else if (m.type === 'warning') log.warn({ model: init.modelPath }, m.message);
        else if (m.type === 'init-error') reject(new Error(m.message));
      };
      worker.on('message', onMsg);
      worker.once('error', reject);
      worker.once('exit', (code) => reject(new Error(`model worker exited with code ${code} while loading`)));
      worker.postMessage({ type: 'init', ...init } satisfies WorkerCommand);
    }).catch(async (e) => {
      // Safe here, unlike in close(): after init-error the worker runs nothing more, and after error or exit it is gone.
      await worker.terminate();
      // It ended itself because the process is exiting (threads-at-exit.ts): not a load failure.
      throw exitUnderway() ? this.closed() : e;
    });
    worker.removeAllListeners('error').removeAllListeners('exit');
    worker.once('exit', freeDeviceLock);
    worker.on('message', (m: WorkerEvent) => this.onReply(m));
    worker.on('error', (e) => this.lost(worker, e));
    worker.on('exit', (code) => this.lost(worker, new Error(`exited with code ${code}`)));
    this.worker = worker;
    return arch;
  }

  /** The worker died: fail what it held, then start it again within the restart budget. */
  private lost(w: Worker, cause: Error): void {
    if (w !== this.worker || this.closing || exitUnderway()) return;
    this.worker = undefined;
    // Its sequences died with it: the other workers get their cores back now, not when it restarts (peers.ts).
    new WorkerPeers(this.init.peers).rest();
    const err = new WorkerLost(`model ${this.modelId}'s worker died: ${cause.message}`);
    log.error({ model: this.modelId, err: cause }, 'model worker died; its requests in flight fail');
    for (const p of this.pending.values()) p.fail(err);
    this.pending.clear();
    this.onTokens.clear();
    this.kvBytes = 0;
    const now = Date.now();
    while (this.restarts.length && now - this.restarts[0]! > WORKER_RESTART_WINDOW_MS) this.restarts.shift();
    if (this.restarts.length >= WORKER_RESTARTS_MAX) {
      this.down = err;
      M.modelDown.set(this.labels, true);
      log.error({ model: this.modelId, restarts: this.restarts.length, windowMs: WORKER_RESTART_WINDOW_MS }, 'model worker keeps dying; the model stays down');
    } else {
      this.restarts.push(now);
      M.workerRestarts.inc(this.labels);
      const t0 = performance.now();
      this.restarting = this.spawn().then(
        () => log.warn({ model: this.modelId, ms: Math.round(performance.now() - t0) }, 'model worker restarted'),
        (e) => {
          this.down = new WorkerLost(`model ${this.modelId}'s worker could not be restarted: ${(e as Error).message}`);
          M.modelDown.set(this.labels, true);
          log.error({ model: this.modelId, err: e }, 'model worker could not be restarted; the model stays down');
        },
      );
      void this.restarting.finally(() => (this.restarting = undefined));
    }
    this.onLost?.(err);
  }

  /** Whether the model can run now (its worker is up or coming back). */
  get alive(): boolean {
    return !this.down;
  }

  private onReply(m: WorkerEvent): void {
    if (m.type === 'memory') {
      M.workerMemory.set(this.labels, m.heapUsedBytes, m.externalBytes);
      // The worker frees an idle slot cache on its own (worker.ts KV_SLOTS_IDLE_RELEASE_MS): the gauge follows here.
      this.kvBytes = m.kvBytes;
      M.kvBytes.set(this.labels, m.kvBytes);
    }
    if (!('id' in m)) return;
    if (m.type === 'tokens') {
      const on = this.onTokens.get(m.id);
      for (const st of m.steps) on?.(st.seqs, st.tokens, st.logprobs, st.madeAt - performance.timeOrigin, st.stepMs);
      return;
    }
    const p = this.pending.get(m.id);
    if (!p) return;
    this.pending.delete(m.id);
    if (m.type === 'error') p.fail(new Error(m.message));
    else p.ok(m);
  }

  private async call(msg: WorkerCommand & { id: number }, transfer: ArrayBuffer[] = []): Promise<WorkerEvent> {
    if (this.restarting) await this.restarting;
    if (this.closing) throw this.closed();
    const w = this.worker;
    if (!w) throw this.down ?? new WorkerLost(`model ${this.modelId}'s worker is not running`);
    return new Promise((ok, fail) => {
      this.pending.set(msg.id, { ok, fail });
      w.postMessage(msg, transfer);
    });
  }

  /** A prompt step: last-position logits of every row, and the token sampled for rows that carried a sampler (-1 for the others). */
  async step(rows: StepRow[]): Promise<StepResult> {
    return this.stepResult(await this.call({ type: 'step', id: this.nextId++, rows }));
  }

  /** A prompt step that joins the decode run in flight (or runs as a step when there is none). */
  async join(rows: StepRow[]): Promise<StepResult> {
    return this.stepResult(await this.call({ type: 'join', id: this.nextId++, rows }));
  }

  private stepResult(e: WorkerEvent): StepResult {
    const r = e as Extract<WorkerEvent, { type: 'step' }>;
    this.kvBytes = r.kvBytes;
    this.countPasses(r.passes);
    return { logits: r.logits, tokens: r.tokens, logprobs: r.logprobs, rowsInStep: r.rowsInStep, missed: r.missed };
  }

  /**
   * A decode run: the worker steps these sequences on its own, calling
   * `onTokens` with each step's tokens, until each has ended or been freed,
   * `interrupt()` is called or `stepsMax` steps ran. Resolves when the worker has stopped.
   */
  async decode(seqs: number[], stepsMax: number, onTokens: OnTokens): Promise<void> {
    const id = this.nextId++;
    this.onTokens.set(id, onTokens);
    this.decoding = id;
    try {
      const r = (await this.call({ type: 'decode', id, seqs, stepsMax })) as Extract<WorkerEvent, { type: 'decode-done' }>;
      this.kvBytes = r.kvBytes;
      this.countPasses(r.passes);
    } finally {
      this.onTokens.delete(id);
      if (this.decoding === id) this.decoding = undefined;
    }
  }

  /** The worker's pass counts since it started, as seen last: the counter takes the difference. */
  private passesSeen: ModelPasses = noPasses();
  private countPasses(p: ModelPasses): void {
    M.passes.inc({ model: this.modelId, threads: 'all' }, p.wide - this.passesSeen.wide);
    M.passes.inc({ model: this.modelId, threads: 'one' }, p.narrow - this.passesSeen.narrow);
    M.passes.inc({ model: this.modelId, threads: 'all_spinning' }, p.spinning - this.passesSeen.spinning);
    M.passes.inc({ model: this.modelId, threads: 'all_prefill' }, p.prefill - this.passesSeen.prefill);
    M.passes.inc({ model: this.modelId, threads: 'all_prefill_spinning' }, p.prefillSpinning - this.passesSeen.prefillSpinning);
    M.passes.inc({ model: this.modelId, threads: 'one_prefill' }, p.prefillNarrow - this.passesSeen.prefillNarrow);
    M.passes.inc({ model: this.modelId, threads: 'all_long' }, p.long - this.passesSeen.long);
    this.passesSeen = { ...p };
  }

  /** Ends the decode run in flight after its current step (none in flight: nothing to end). */
  interrupt(): void {
    if (!this.closing && this.decoding !== undefined) this.worker?.postMessage({ type: 'interrupt', id: this.decoding } satisfies WorkerCommand);
  }

  async fork(from: number, to: number[], at?: number): Promise<void> {
    await this.call({ type: 'fork', id: this.nextId++, from, to, at });
  }

  free(seqs: number[]): void {
    if (seqs.length && !this.closing) this.worker?.postMessage({ type: 'free', seqs } satisfies WorkerCommand);
  }

  /** These generations make no more tokens, and their caches stay for later prompts (protocol.ts `keep`) until freed. */
  keep(seqs: number[]): void {
    if (seqs.length && !this.closing) this.worker?.postMessage({ type: 'keep', seqs } satisfies WorkerCommand);
  }

  /**
   * Stops the worker: the work already sent finishes (a decode run after its current step), then
   * the worker releases its sessions and ends its own thread. Never terminate() here: one that
   * lands inside an onnxruntime call aborts the whole process (worker.ts endThread). Calls made
   * from now on fail with RunnerClosed.
   */
  close(): Promise<void> {
    this.closing = true;
    return (this.stopped ??= (async () => {
      await this.restarting;
      const w = this.worker;
      if (!w) return;
      const exited = new Promise<void>((r) => w.once('exit', () => r()));
      w.postMessage({ type: 'close', id: this.nextId++ } satisfies WorkerCommand);
      await exited;
      this.worker = undefined;
      for (const p of this.pending.values()) p.fail(this.closed());
      this.pending.clear();
      this.onTokens.clear();
    })());
  }

  private closed(): RunnerClosed {
    return new RunnerClosed(`model ${this.modelId} is shutting down`);
  }

  /** Fault injection for tests: the worker exits as after an uncaught error, between two of its steps. */
  crashForTest(): void {
    this.worker?.postMessage({ type: 'exit', code: 1 } satisfies WorkerCommand);
  }
}

/** A worker script of this folder, compiled: beside this file under dist/, or in dist/ when run from source (vitest). */
export function workerPath(name = 'worker.js'): string {
  const here = fileURLToPath(import.meta.url);
  const beside = path.join(path.dirname(here), name);
  if (fs.existsSync(beside)) return beside;
  let d = path.dirname(here);
  while (!fs.existsSync(path.join(d, 'package.json'))) d = path.dirname(d);
  const built = path.join(d, 'dist/src/inference/runtime', name);
  if (!fs.existsSync(built)) throw new Error(`model worker not built: run npm run build (looked for ${built})`);
  return built;
}
