import { Worker, type Transferable } from 'node:worker_threads';
import { log } from '../../log.js';
import { workerPath } from './runner.js';

/**
 * A worker thread that runs jobs off the event loop, one after another, answered by id:
 * started at the first job, holding the process open only while a job is out (an idle
 * thread keeps neither a stopping daemon nor a finished script alive), and started again
 * at the next job after it dies (what it held fails). The tokenizer thread and the body
 * screening thread are two of these.
 */
export class JobThread<Job extends { id: number }, Result extends { id: number }> {
  private worker: Worker | undefined;
  private seq = 0;
  private readonly pending = new Map<number, { ok: (r: Result) => void; fail: (e: Error) => void }>();

  /** `file`: the worker's script, relative to runtime/ (as `workerPath` takes it); `name`: for the log. */
  constructor(
    private readonly file: string,
    private readonly name: string,
  ) {}

  run(job: Omit<Job, 'id'>, transfer: readonly Transferable[] = []): Promise<Result> {
    const w = (this.worker ??= this.start());
    const id = ++this.seq;
    if (!this.pending.size) w.ref();
    return new Promise((ok, fail) => {
      this.pending.set(id, { ok, fail });
      w.postMessage({ ...job, id }, transfer);
    });
  }

  private start(): Worker {
    const w = new Worker(workerPath(this.file));
    w.on('message', (r: Result) => {
      const p = this.pending.get(r.id);
      this.pending.delete(r.id);
      if (!this.pending.size) w.unref();
      p?.ok(r);
    });
    w.on('error', (e) => this.lost(w, e));
    w.on('exit', (code) => this.lost(w, new Error(`${this.name} exited with code ${code}`)));
    // Idle until run() posts; after the listeners, since a 'message' listener refs the port again.
    w.unref();
    return w;
  }

  private lost(w: Worker, e: Error): void {
    if (this.worker !== w) return;
    this.worker = undefined;
    if (this.pending.size) log.error({ err: e, jobs: this.pending.size }, `${this.name} lost`);
    for (const p of this.pending.values()) p.fail(e);
    this.pending.clear();
  }
}
