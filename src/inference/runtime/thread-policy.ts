import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';

// The Linux scheduling policy of the calling thread. Node has no call for it (os.setPriority
// sets niceness only), so util-linux's `chrt` sets it by thread id; the threads the caller
// starts afterwards (onnxruntime's pools) inherit it.

export const MODEL_THREAD_SCHEDS = ['idle', 'normal'] as const;
/**
 * - `idle`: SCHED_IDLE, the thread runs only when no other thread wants the core: a request
 *   that wakes the HTTP thread takes the core at once, not after the model's time slice;
 * - `normal`: the default policy, at the thread's niceness.
 */
export type ModelThreadSched = (typeof MODEL_THREAD_SCHEDS)[number];

/** Puts the calling thread under SCHED_IDLE; throws where that cannot be done (not Linux, no chrt). */
export function scheduleThisThreadIdle(): void {
  if (process.platform !== 'linux') throw new Error('SCHED_IDLE is a Linux policy');
  const tid = fs.readlinkSync('/proc/thread-self').split('/').pop()!;
  execFileSync('chrt', ['--idle', '--pid', '0', tid], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 5_000 });
}

/**
 * The niceness of a model worker's own thread. It runs the one-thread sessions (a lone stream's
 * decode steps) and the JavaScript between steps, and at MODEL_THREADS_NICE a thread that wants a
 * whole core weighs a tenth of one at 0: the kernel's balancer counted its core as nearly free
 * and put the HTTP thread and a local client on it at every token (one stream of m25 int4, Zen 5:
 * 1.10x the tokens/s at the daemon's niceness, 7 of 8 alternated pairs; bench/README.md "The
 * worker's own thread"). Its onnxruntime pools keep MODEL_THREADS_NICE, so a request still takes
 * a core from them at once. Where the workers' own threads could fill every core (`workers`, an
 * upper bound, not below `cores`) they keep MODEL_THREADS_NICE too.
 */
export function workerThreadNice(nice: number, workers: number, cores: number): number {
  return workers < cores ? 0 : nice;
}

/** This process's threads (Linux). */
const threadIds = (): string[] => fs.readdirSync('/proc/self/task');

/**
 * Runs `start` and gives `nice` to the threads that began while it ran, where they are as many as
 * one of `expected` (an onnxruntime session on N intra-op threads starts N - 1: the calling thread
 * is one; a worker's first also starts onnxruntime's environment, one thread more where no other
 * worker's holds it). Other threads started meanwhile (a job thread's first use) would make the
 * count differ: then none is touched, and the answer says so, as where setpriority refuses.
 * Linux only.
 */
export async function niceThreadsStartedBy<T>(start: () => Promise<T>, expected: readonly number[], nice: number): Promise<{ value: T; niced: boolean }> {
  const before = new Set(threadIds());
  const value = await start();
  const started = threadIds().filter((t) => !before.has(t));
  if (!expected.includes(started.length)) return { value, niced: false };
  try {
    for (const t of started) os.setPriority(Number(t), nice);
  } catch {
    return { value, niced: false };
  }
  return { value, niced: true };
}
