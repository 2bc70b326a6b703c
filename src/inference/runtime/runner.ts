import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { log } from '../../log.js';
import type { Arch, InitMsg, Reply, Request, StepRow } from './protocol.js';

/**
 * The main-thread side of a model's worker. Calls are serialised by the
 * scheduler (one step in flight per model), so replies match by id.
 */
export class Runner {
  private readonly worker: Worker;
  private nextId = 1;
  private readonly pending = new Map<number, { ok: (r: Reply) => void; fail: (e: Error) => void }>();
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

  async step(rows: StepRow[]): Promise<Float32Array> {
    const r = (await this.call({ type: 'step', id: this.nextId++, rows })) as Extract<Reply, { type: 'step' }>;
    this.kvBytes = r.kvBytes;
    return r.logits;
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

/** The compiled worker: next to this file in dist/, or dist/ of the repo when this file runs as .ts (vitest). */
function workerPath(): string {
  const here = fileURLToPath(import.meta.url);
  const beside = path.join(path.dirname(here), 'worker.js');
  if (fs.existsSync(beside)) return beside;
  let d = path.dirname(here);
  while (!fs.existsSync(path.join(d, 'package.json'))) d = path.dirname(d);
  const built = path.join(d, 'dist/src/inference/runtime/worker.js');
  if (!fs.existsSync(built)) throw new Error(`model worker not built: run npm run build (looked for ${built})`);
  return built;
}
