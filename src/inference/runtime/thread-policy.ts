import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

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
