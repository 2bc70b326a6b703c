import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { deviceLockCell, releaseDeviceLockOf } from './device-lock.js';

// Threads that each hold the lock around work that waits (as a step awaits its run) and count how
// many hold it at once in a shared cell: never more than one. The threads load the built module
// (dist/), as model workers do.
const holder = `
const { workerData, parentPort } = require('node:worker_threads');
import(workerData.module).then(async ({ DeviceLock }) => {
  const lock = new DeviceLock(workerData.lock);
  const inside = new Int32Array(workerData.inside);
  for (let i = 0; i < workerData.rounds; i++) {
    await lock.hold(async () => {
      const now = Atomics.add(inside, 0, 1) + 1;
      Atomics.store(inside, 1, Math.max(Atomics.load(inside, 1), now));
      // Work that holds it calls work that holds it (a step inside a warm-up): no deadlock.
      await lock.hold(async () => new Promise((r) => setTimeout(r, 1)));
      lock.holdNow(() => undefined);
      Atomics.sub(inside, 0, 1);
    });
  }
  if (workerData.exitHolding) lock.holdNow(() => process.exit(3));
  parentPort.postMessage('done');
});
`;

const moduleUrl = new URL('../../../dist/src/inference/runtime/device-lock.js', import.meta.url).href;

function run(lock: SharedArrayBuffer, inside: SharedArrayBuffer, rounds: number, exitHolding = false): { worker: Worker; done: Promise<number> } {
  const worker = new Worker(holder, { eval: true, workerData: { module: moduleUrl, lock, inside, rounds, exitHolding } });
  return { worker, done: new Promise((resolve, reject) => worker.once('error', reject).once('exit', resolve)) };
}

describe('DeviceLock', () => {
  it('lets one thread at a time hold it, through work that waits and holds it again', async () => {
    const [lock, inside] = [deviceLockCell(), new SharedArrayBuffer(8)];
    const threads = [0, 1, 2].map(() => run(lock, inside, 30));
    expect(await Promise.all(threads.map((t) => t.done))).toEqual([0, 0, 0]);
    const counts = new Int32Array(inside);
    expect(counts[1]).toBe(1); // at most one inside at any time
    expect(counts[0]).toBe(0);
    expect(new Int32Array(lock)[0]).toBe(0); // free again
  }, 30_000);

  it('is freed for the others when a thread ends holding it', async () => {
    const [lock, inside] = [deviceLockCell(), new SharedArrayBuffer(8)];
    const dying = run(lock, inside, 1, true);
    const id = dying.worker.threadId;
    expect(await dying.done).toBe(3);
    // The thread is gone and the cell still names it: what Runner frees on the worker's exit.
    expect(new Int32Array(lock)[0]).toBe(id);
    releaseDeviceLockOf(lock, id);
    expect(await run(lock, inside, 5).done).toBe(0);
    // Another thread's id leaves a held lock alone.
    Atomics.store(new Int32Array(lock), 0, id + 1000);
    releaseDeviceLockOf(lock, id);
    expect(new Int32Array(lock)[0]).toBe(id + 1000);
  }, 30_000);
});
