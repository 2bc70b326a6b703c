import { Worker } from 'node:worker_threads';
import { log } from '../../log.js';
import { workerPath } from './runner.js';

/**
 * Texts up to this many characters are tokenised inline: the tokenizer runs at
 * 3-8 µs per character here (10,000 characters took 26-77 ms), so this is at
 * most ~4 ms of event-loop time. Longer texts go to the tokenizer thread.
 */
export const TOKENIZE_INLINE_CHARS_MAX = 512;

export interface TokenizeJob {
  id: number;
  dir: string;
  text: string;
}
export type TokenizeResult = { id: number; ids: Int32Array } | { id: number; error: string };

/**
 * One worker thread, shared by every model, that encodes long texts off the
 * event loop. Jobs run one after another (a queue, not a pool: the two cores
 * belong to the model workers); every text it gets is already bounded by the
 * model's context length in characters (see ModelText.charsPerTokenMax).
 */
class TokenizeThread {
  private worker: Worker | undefined;
  private seq = 0;
  private readonly pending = new Map<number, { ok: (ids: number[]) => void; fail: (e: Error) => void }>();

  private start(): Worker {
    const w = new Worker(workerPath('tokenize-worker.js'));
    // The thread must not keep a stopping daemon alive.
    w.unref();
    w.on('message', (m: TokenizeResult) => {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if ('error' in m) p.fail(new Error(m.error));
      else p.ok(Array.from(m.ids));
    });
    w.on('error', (e) => this.lost(w, e));
    w.on('exit', (code) => this.lost(w, new Error(`tokenizer thread exited with code ${code}`)));
    return w;
  }

  /** A dead thread fails what it held; the next job starts a new one. */
  private lost(w: Worker, e: Error): void {
    if (this.worker !== w) return;
    this.worker = undefined;
    if (this.pending.size) log.error({ err: e, jobs: this.pending.size }, 'tokenizer thread lost');
    for (const p of this.pending.values()) p.fail(e);
    this.pending.clear();
  }

  encode(dir: string, text: string): Promise<number[]> {
    const w = (this.worker ??= this.start());
    const id = ++this.seq;
    return new Promise((ok, fail) => {
      this.pending.set(id, { ok, fail });
      w.postMessage({ id, dir, text } satisfies TokenizeJob);
    });
  }
}

export const tokenizeThread = new TokenizeThread();
