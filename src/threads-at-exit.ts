import type { Worker } from 'node:worker_threads';

/**
 * Worker threads that must end on their own before the process exits.
 *
 * A process exit stops every worker thread from outside, and one stopped inside an
 * onnxruntime-node call (a step's run, a session being created while a model loads) aborts
 * the whole process: SIGABRT, "terminate called after throwing an instance of 'Napi::Error'"
 * (runtime/worker.ts endThread). So an exit that skips the shutdown (a second signal, a failed
 * start, an uncaught error) first asks each held thread to end itself, which it does between
 * two such calls, and waits for them (main.ts bounds the wait). Process-wide on purpose: the
 * hazard is the process's exit, and it exists before any daemon object does (models load
 * during start-up).
 */
const held = new Map<Worker, () => void>();
let ending = false;

/** Holds the process's exit for `w` until it has ended; `askToEnd` makes it end itself. */
export function holdExitFor(w: Worker, askToEnd: () => void): void {
  held.set(w, askToEnd);
  w.once('exit', () => held.delete(w));
  if (ending) askToEnd();
}

/** Whether the process is on its way out: a thread that ends now is not a crash, nothing new should start. */
export function exitUnderway(): boolean {
  return ending;
}

/** Asks every held thread to end itself; resolves once all have ended. */
export function endHeldThreads(): Promise<void> {
  ending = true;
  return Promise.all(
    [...held].map(
      ([w, askToEnd]) =>
        new Promise<void>((r) => {
          w.once('exit', () => r());
          askToEnd();
        }),
    ),
  ).then(() => undefined);
}
