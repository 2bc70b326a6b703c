import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { ApiError } from '../../errors.js';
import { log } from '../../log.js';
import type { Arch, FromWorker, InitMsg, StepTimings, ToWorker } from './protocol.js';

/** One step's answer: the logits (or log-probs) rows asked for, in row order. */
export interface StepResult {
  logits: Float32Array;
  kvBytes: number;
  timings: StepTimings;
}

export interface StepRows {
  seqs: Int32Array;
  counts: Int32Array;
  tokens: Int32Array;
  want: Uint8Array;
}

/**
 * The main-thread side of a model's worker thread. The scheduler keeps at
 * most one step in flight; fork and free are fire-and-forget and the worker
 * applies every message in order.
 */
export class ModelWorker {
  private nextId = 1;
  private readonly pending = new Map<number, { ok: (r: StepResult | undefined) => void; fail: (e: Error) => void }>();
  private dead: Error | undefined;

  private constructor(
    private readonly worker: Worker,
    readonly arch: Arch,
    readonly modelPath: string,
  ) {
    worker.on('message', (m: FromWorker) => this.onMessage(m));
    worker.on('error', (e) => this.die(e));
    worker.on('exit', (code) => this.die(new Error(`model worker exited with code ${code}`)));
  }

  static async start(init: Omit<InitMsg, 'type'>): Promise<ModelWorker> {
    const worker = new Worker(await workerFile());
    const r = await new Promise<FromWorker>((resolve, reject) => {
      const onExit = (code: number) => reject(new Error(`model worker exited with code ${code} while loading`));
      worker.once('message', (m: FromWorker) => {
        worker.off('exit', onExit);
        resolve(m);
      });
      worker.once('error', reject);
      worker.once('exit', onExit);
      worker.postMessage({ type: 'init', ...init } satisfies ToWorker);
    }).catch(async (e) => {
      await worker.terminate();
      throw e;
    });
    if (r.type !== 'ready') {
      await worker.terminate();
      throw new Error(r.type === 'init-error' ? r.message : `unexpected worker message ${r.type}`);
    }
    if (r.warning) log.warn({ model: init.modelPath }, r.warning);
    return new ModelWorker(worker, r.arch, init.modelPath);
  }

  private onMessage(m: FromWorker): void {
    if (m.type === 'error' && m.id < 0) {
      log.error({ model: this.modelPath, err: m.message }, 'model worker');
      return;
    }
    if (!('id' in m)) return;
    const p = this.pending.get(m.id);
    if (!p) return;
    this.pending.delete(m.id);
    if (m.type === 'error') p.fail(new Error(m.message));
    else if (m.type === 'step') p.ok({ logits: m.logits, kvBytes: m.kvBytes, timings: m.timings });
    else p.ok(undefined);
  }

  private die(e: Error): void {
    if (this.dead) return;
    this.dead = e;
    log.error({ model: this.modelPath, err: e }, 'model worker stopped');
    for (const p of this.pending.values()) p.fail(e);
    this.pending.clear();
  }

  step(rows: StepRows): Promise<StepResult> {
    if (this.dead) return Promise.reject(new ApiError('unavailable', 'the model worker stopped; the model is unavailable'));
    const id = this.nextId++;
    return new Promise<StepResult>((ok, fail) => {
      this.pending.set(id, { ok: ok as (r: StepResult | undefined) => void, fail });
      // The arrays are small and built per step: transfer them.
      this.worker.postMessage({ type: 'step', id, ...rows } satisfies ToWorker, [
        rows.seqs.buffer as ArrayBuffer,
        rows.counts.buffer as ArrayBuffer,
        rows.tokens.buffer as ArrayBuffer,
        rows.want.buffer as ArrayBuffer,
      ]);
    });
  }

  fork(from: number, to: number[]): void {
    if (!this.dead) this.worker.postMessage({ type: 'fork', from, to } satisfies ToWorker);
  }

  free(seqs: number[]): void {
    if (seqs.length && !this.dead) this.worker.postMessage({ type: 'free', seqs } satisfies ToWorker);
  }

  async close(): Promise<void> {
    if (!this.dead) {
      const id = this.nextId++;
      await Promise.race([
        new Promise<void>((ok, fail) => {
          this.pending.set(id, { ok: () => ok(), fail });
          this.worker.postMessage({ type: 'close', id } satisfies ToWorker);
        }).catch(() => undefined),
        new Promise((r) => setTimeout(r, 5000).unref()),
      ]);
    }
    this.dead ??= new Error('closed');
    await this.worker.terminate();
  }
}

/**
 * The worker's compiled file. From dist/ it is `worker.js` beside this
 * module. When this module runs as TypeScript (vitest imports the sources),
 * the worker still needs JavaScript: worker.ts and protocol.ts (its only
 * run-time import) are transpiled with the `typescript` API into the same
 * place under dist/ when missing or older than their sources — no full build
 * needed, and the paths (node_modules resolution included) match a real build.
 */
export async function workerFile(): Promise<string> {
  const here = fileURLToPath(import.meta.url);
  const dir = path.dirname(here);
  if (!here.endsWith('.ts')) return path.join(dir, 'worker.js');
  let root = dir;
  while (!fs.existsSync(path.join(root, 'package.json'))) {
    const up = path.dirname(root);
    if (up === root) throw new Error(`no package.json above ${dir}`);
    root = up;
  }
  const outDir = path.join(root, 'dist', path.relative(root, dir));
  fs.mkdirSync(outDir, { recursive: true });
  let ts: typeof import('typescript') | undefined;
  for (const name of ['worker', 'protocol']) {
    const src = path.join(dir, `${name}.ts`);
    const out = path.join(outDir, `${name}.js`);
    if (fs.existsSync(out) && fs.statSync(out).mtimeMs >= fs.statSync(src).mtimeMs) continue;
    ts ??= (await import('typescript')).default;
    const js = ts.transpileModule(fs.readFileSync(src, 'utf8'), {
      compilerOptions: { module: ts.ModuleKind.ES2022, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: false },
      fileName: src,
    }).outputText;
    const tmp = `${out}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, js);
    fs.renameSync(tmp, out);
  }
  return path.join(outDir, 'worker.js');
}
