import { threadId } from 'node:worker_threads';

// Model workers on webgpu share one device: onnxruntime keeps one webgpu context a
// process, and two threads using it at once end the process. A chat and an evaluation model
// stepping together on lavapipe crashed in two loaded runs of three (SIGSEGV inside onnxruntime);
// two workers releasing their sessions together, in one run of four. So each worker holds this
// lock for its device work: its load and warm-up, a step, giving back its cache or its sessions.
// The cell holds the holder's thread id (0: free), so the main thread can free it for a worker
// that ended holding it (releaseDeviceLockOf), and no other worker waits on a dead one.

const FREE = 0;
/** Longest one wait sleeps before it looks again: a notify is never lost for longer. */
const DEVICE_LOCK_WAIT_MS = 50;

/** The shared cell of a process's device lock: made once, handed to every GPU worker (InitMsg). */
export function deviceLockCell(): SharedArrayBuffer {
  return new SharedArrayBuffer(Int32Array.BYTES_PER_ELEMENT);
}

export class DeviceLock {
  private readonly cell: Int32Array;
  /** Holds of this thread in progress: work that holds the lock may call work that holds it. */
  private depth = 0;

  constructor(buffer: SharedArrayBuffer) {
    this.cell = new Int32Array(buffer);
  }

  /** Runs `work` holding the lock; this thread blocks until it is free. */
  async hold<T>(work: () => Promise<T>): Promise<T> {
    this.acquire();
    try {
      return await work();
    } finally {
      this.release();
    }
  }

  /** `hold` for work that does not wait. */
  holdNow<T>(work: () => T): T {
    this.acquire();
    try {
      return work();
    } finally {
      this.release();
    }
  }

  private acquire(): void {
    if (this.depth++ > 0) return;
    // Thread ids start at 1 in workers (0 is the main thread, which never holds it).
    for (let seen = Atomics.compareExchange(this.cell, 0, FREE, threadId); seen !== FREE; seen = Atomics.compareExchange(this.cell, 0, FREE, threadId)) {
      Atomics.wait(this.cell, 0, seen, DEVICE_LOCK_WAIT_MS);
    }
  }

  private release(): void {
    if (--this.depth > 0) return;
    Atomics.store(this.cell, 0, FREE);
    Atomics.notify(this.cell, 0, 1);
  }
}

/** Frees the lock if the worker of `holder` (its threadId) ended holding it: the others go on. */
export function releaseDeviceLockOf(buffer: SharedArrayBuffer, holder: number): void {
  const cell = new Int32Array(buffer);
  if (Atomics.compareExchange(cell, 0, holder, FREE) === holder) Atomics.notify(cell, 0, 1);
}
