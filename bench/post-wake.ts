import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';

// What a model worker's token post costs it on a machine whose cores are full, without a model:
// a "worker" thread computes for --step-ms, posts a message of --steps held steps (the shape of
// token-posts.ts's post), and measures the postMessage call's wall time; the main thread, woken by
// each message, works --work-ms on it (the HTTP thread's SSE writes of a post's tokens); --spin
// puts a thread that never sleeps on the other core (onnxruntime's pool thread spinning between
// a decode run's steps), at niceness 10 as the daemon's pools run. Unpinned, where the kernel puts
// the woken main thread depends on where it ran last, so a run reads one of two figures; --pin
// together (the worker and the main thread on vCPU 0, the spinner on 1) or apart (the worker on
// 0, the main thread and the spinner on 1) reads each (taskset; Linux). Figures are the mean,
// p50 and p90 of the post calls; bench/README.md "A token post on a Zen 5" records them.
// Usage: node dist/bench/post-wake.js [--work-ms 0.25] [--step-ms 1.5] [--steps 1,20] [--spin] [--pin together|apart] [--posts 500]

const PINS = ['none', 'together', 'apart'] as const;
type Pin = (typeof PINS)[number];
type Role = { role: 'spin' | 'post'; pin: Pin; stepMs: number; steps: number[]; posts: number };

/** This thread's kernel id (Linux). */
const tid = (): number => Number(fs.readlinkSync('/proc/thread-self').split('/').pop());
const pinTo = (cpu: number, thread: number): void => void execFileSync('taskset', ['-p', '-c', String(cpu), String(thread)], { stdio: 'ignore' });
/** Posts before the timed ones: the threads' first wakes and the code's first runs. */
const WARM_POSTS = 50;
/** The niceness of the daemon's onnxruntime pool threads (MODEL_THREADS_NICE's default). */
const POOL_NICE = 10;

function busy(ms: number): void {
  const t = performance.now();
  while (performance.now() - t < ms);
}

async function main(): Promise<void> {
  const { benchArgs, machine, wholeFlag, wholeListFlag } = await import('./lib.js');
  const args = benchArgs();
  /** A flag of milliseconds, 0 or more (a typo stops the run, as wholeFlag's do). */
  const msFlag = (flag: string, fallback: number): number => {
    const v = Number(args.get(flag) ?? fallback);
    if (!(Number.isFinite(v) && v >= 0)) throw new Error(`--${flag}: a number of milliseconds, at least 0, got '${args.get(flag)}'`);
    return v;
  };
  const workMs = msFlag('work-ms', 0.25);
  const pin = (args.get('pin') ?? 'none') as Pin;
  if (!PINS.includes(pin)) throw new Error(`--pin: one of ${PINS.join(', ')}, got '${pin}'`);
  const role: Omit<Role, 'role'> = { pin, stepMs: msFlag('step-ms', 1.5), steps: args.has('steps') ? wholeListFlag(args, 'steps', 1, 1) : [1, 20], posts: wholeFlag(args, 'posts', 500, 1) };
  const spinner = args.has('spin') ? new Worker(new URL(import.meta.url), { workerData: { ...role, role: 'spin' } satisfies Role }) : undefined;
  const poster = new Worker(new URL(import.meta.url), { workerData: { ...role, role: 'post' } satisfies Role });
  if (pin !== 'none') pinTo(pin === 'apart' ? 1 : 0, tid());
  const pins = { none: 'no thread pinned', together: 'the worker and the main thread on vCPU 0, the spinner on 1', apart: 'the worker on vCPU 0, the main thread and the spinner on 1' };
  console.log(`machine: ${machine()}\nthe main thread works ${workMs} ms a message; ${spinner ? `a thread spins at niceness ${POOL_NICE}` : 'no other thread is busy'}; ${pins[pin]}; one post every ${role.stepMs} ms of the worker's own work`);
  await new Promise<void>((resolve, reject) => {
    poster.on('error', reject);
    poster.on('message', (m: { result?: string }) => {
      if (m.result === undefined) return busy(workMs);
      console.log(m.result);
      resolve();
    });
  });
  await Promise.all([poster.terminate(), spinner?.terminate()]);
}

function postRole(r: Role): void {
  if (r.pin !== 'none') pinTo(0, tid());
  const lines: string[] = [];
  for (const k of r.steps) {
    const took: number[] = [];
    for (let i = 0; i < WARM_POSTS + r.posts; i++) {
      busy(r.stepMs);
      const steps = Array.from({ length: k }, (_, j) => ({ seqs: [7], tokens: Int32Array.of(100 + j), logprobs: undefined, madeAt: performance.timeOrigin + performance.now(), stepMs: r.stepMs }));
      const t = performance.now();
      parentPort!.postMessage({ type: 'tokens', id: 1, steps });
      if (i >= WARM_POSTS) took.push((performance.now() - t) * 1000);
    }
    took.sort((a, b) => a - b);
    const mean = took.reduce((s, x) => s + x, 0) / took.length;
    const at = (q: number) => took[Math.min(took.length - 1, Math.floor(q * took.length))]!.toFixed(1);
    lines.push(`${k} step(s) a post: postMessage mean ${mean.toFixed(1)} us, p50 ${at(0.5)}, p90 ${at(0.9)} (${r.posts} posts)`);
  }
  parentPort!.postMessage({ result: lines.join('\n') });
}

function spinRole(r: Role): void {
  if (r.pin !== 'none') pinTo(1, tid());
  // A thread id's priority is that thread's niceness on Linux (thread-policy.ts does the same).
  os.setPriority(tid(), POOL_NICE);
  for (;;) busy(1000);
}

if (isMainThread) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
} else {
  const r = workerData as Role;
  if (r.role === 'spin') spinRole(r);
  else postRole(r);
}
