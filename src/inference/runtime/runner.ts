import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { log } from '../../log.js';
import type { TokenLogprob } from '../engine-api.js';
import type { Arch, InitMsg, Reply, Request, StepRow } from './protocol.js';

/** A prompt step's answer: every row's last-position logits; sampled rows' tokens (-1 for the others) and logprobs when asked. */
export interface StepResult {
  logits: Float32Array;
  tokens: Int32Array;
  logprobs?: Array<TokenLogprob | null>;
}
/** One decode-run step: the token (and, when asked, logprob) of each sequence that ran. */
export type OnTokens = (seqs: number[], tokens: Int32Array, logprobs?: Array<TokenLogprob | null>) => void;

/**
 * The main-thread side of a model's worker. Calls are serialised by the
 * scheduler (one step or decode run in flight per model); replies match by id.
 */
export class Runner {
  private readonly worker: Worker;
  private nextId = 1;
  private readonly pending = new Map<number, { ok: (r: Reply) => void; fail: (e: Error) => void }>();
  private readonly onTokens = new Map<number, OnTokens>();
  arch!: Arch;
  kvBytes = 0;

  private constructor(worker: Worker) {
    this.worker = worker;
  }

  static async start(init: Omit<InitMsg, 'type'>): Promise<Runner> {
    const worker = new Worker(workerPath());
    const r = new Runner(worker);
    r.arch = await new Promise<Arch>((resolve, reject) => {
      const onMsg = (m: Reply) => {
        if (m.type === 'ready') {
          worker.off('message', onMsg);
          resolve(m.arch);
        } else if (m.type === 'init-error') {
          if (m.message.startsWith('fallback:')) log.warn({ model: init.modelPath }, m.message);
          else reject(new Error(m.message));
        }
      };
      worker.on('message', onMsg);
      worker.once('error', reject);
      worker.postMessage({ type: 'init', ...init } satisfies Request);
    });
    worker.on('message', (m: Reply) => r.onReply(m));
    worker.on('error', (e) => {
      log.error({ err: e }, 'model worker crashed');
      for (const p of r.pending.values()) p.fail(e);
      r.pending.clear();
    });
    return r;
  }

  private onReply(m: Reply): void {
    if (!('id' in m)) return;
    if (m.type === 'tokens') {
      this.onTokens.get(m.id)?.(m.seqs, m.tokens, m.logprobs);
      return;
    }
    const p = this.pending.get(m.id);
    if (!p) return;
    this.pending.delete(m.id);
    if (m.type === 'error') p.fail(new Error(m.message));
    else p.ok(m);
  }

  private call(msg: Request & { id: number }, transfer: ArrayBuffer[] = []): Promise<Reply> {
    return new Promise((ok, fail) => {
      this.pending.set(msg.id, { ok, fail });
      this.worker.postMessage(msg, transfer);
    });
  }

  /** A prompt step: last-position logits of every row, and the token sampled for rows that carried a sampler (-1 for the others). */
  async step(rows: StepRow[]): Promise<StepResult> {
    const r = (await this.call({ type: 'step', id: this.nextId++, rows })) as Extract<Reply, { type: 'step' }>;
    this.kvBytes = r.kvBytes;
    return { logits: r.logits, tokens: r.tokens, logprobs: r.logprobs };
  }

  /** A prompt step that joins the decode run in flight (or runs as a step when there is none). */
  async join(rows: StepRow[]): Promise<StepResult> {
    const r = (await this.call({ type: 'join', id: this.nextId++, rows })) as Extract<Reply, { type: 'step' }>;
    this.kvBytes = r.kvBytes;
    return { logits: r.logits, tokens: r.tokens, logprobs: r.logprobs };
  }

  /**
   * A decode run: the worker steps these sequences on its own, calling
   * `onTokens` with each step's tokens, until each has ended or been freed,
   * `interrupt()` is called or `stepsMax` steps ran. Resolves when the worker has stopped.
   */
  async decode(seqs: number[], stepsMax: number, onTokens: OnTokens): Promise<void> {
    const id = this.nextId++;
    this.onTokens.set(id, onTokens);
    try {
      const r = (await this.call({ type: 'decode', id, seqs, stepsMax })) as Extract<Reply, { type: 'decode-done' }>;
      this.kvBytes = r.kvBytes;
    } finally {
      this.onTokens.delete(id);
    }
  }

  /** Ends the running decode after its current step. */
  interrupt(): void {
    this.worker.postMessage({ type: 'interrupt' } satisfies Request);
  }

  async fork(from: number, to: number[]): Promise<void> {
    await this.call({ type: 'fork', id: this.nextId++, from, to });
  }

  free(seqs: number[]): void {
    if (seqs.length) this.worker.postMessage({ type: 'free', seqs } satisfies Request);
  }

  async close(): Promise<void> {
    await this.call({ type: 'close', id: this.nextId++ }).catch(() => undefined);
    await this.worker.terminate();
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
