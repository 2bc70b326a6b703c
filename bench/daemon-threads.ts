import fs from 'node:fs';
import os from 'node:os';
import { startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, benchKey, chatBenchEnv, fmt, machine, PROC_CLOCK_TICKS_PER_S, secondsFlag, statCpuMs, streamPhase, threadCpuMs, wholeFlag } from './lib.js';

// Where a machine's CPU goes while the daemon streams: each daemon thread's CPU time (/proc), the
// benchmark's own (the local client's), other processes (the embedded PostgreSQL's, kernel
// workers), interrupts, the rest, and the time the hypervisor took from this guest's vCPUs (steal),
// over an idle window and then over a phase of N streams. On a machine whose cores
// the model's threads fill, every millisecond another thread runs is taken from them, so this is
// where a one-stream token's time outside the graph's step can be looked for.
// Linux only (/proc). Figures are whole phases, not a timed unit; bench/README.md records them.
// Usage: node dist/bench/daemon-threads.js --model peer/m110 --models-dir /tmp/k14/m110-int4
//   [--streams 1] [--seconds 5] [--max-tokens 64] [--idle-seconds 5]

const args = benchArgs();
const model = args.get('model') ?? 'cloudgate/stories260k';
const streams = wholeFlag(args, 'streams', 1, 1);
const seconds = secondsFlag(args, 'seconds', 5, 1);
const idleSeconds = secondsFlag(args, 'idle-seconds', 5, 0.5);
const maxTokens = wholeFlag(args, 'max-tokens', 64, 1);
/** A thread or process below this share of one core in the phase is not a row of its own: dozens of near-idle ones would hide the few that matter. */
const ROW_SHARE_OF_CORE_MIN = 0.01;

/** Every thread's CPU ms of process `pid`, by thread id. */
function threadsCpu(pid: number): Map<number, number> {
  const out = new Map<number, number>();
  for (const t of fs.readdirSync(`/proc/${pid}/task`).map(Number)) {
    const ms = threadCpuMs(pid, t);
    if (Number.isFinite(ms)) out.set(t, ms);
  }
  return out;
}

/**
 * The whole machine's CPU ms over every core, from /proc/stat's first line: busy (user, nice,
 * system, irq, softirq; guest time is already in user), of it the interrupts' (a loopback
 * socket's receive work runs there; where the kernel accounts it apart, no process is charged
 * it), and steal (time the hypervisor gave a vCPU of this guest to something else while it
 * wanted to run).
 */
function machineCpuMs(): { busy: number; irq: number; steal: number } {
  const [user, nice, system, , , irq, softirq, steal] = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number) as number[];
  const ms = (ticks: number) => (ticks * 1000) / PROC_CLOCK_TICKS_PER_S;
  return { busy: ms(user! + nice! + system! + irq! + softirq!), irq: ms(irq! + softirq!), steal: ms(steal ?? 0) };
}

/** Every other process's CPU ms (all its threads), by pid (a kernel worker's name changes with its work); `processNames` keeps each one's latest name. */
const processNames = new Map<string, string>();
function processesCpu(except: number[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const p of fs.readdirSync('/proc').filter((x) => /^\d+$/.test(x) && !except.includes(Number(x)))) {
    const ms = statCpuMs(`/proc/${p}/stat`);
    if (!Number.isFinite(ms)) continue; // gone meanwhile
    out.set(p, ms);
    try {
      processNames.set(p, fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim());
    } catch {
      // gone meanwhile: the name read before stays
    }
  }
  return out;
}

const selfCpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

interface Window {
  wallMs: number;
  threads: Map<number, number>;
  self: number;
  machine: number;
  irq: number;
  steal: number;
  others: Map<string, number>;
}

// A thread or process that began within the window counts from 0: all its time is the window's.
const delta = <K>(a: Map<K, number>, b: Map<K, number>) => new Map([...b].map(([k, ms]) => [k, ms - (a.get(k) ?? 0)]));

async function measure(pid: number, during: () => Promise<void>): Promise<Window> {
  const except = [pid, process.pid];
  const [t0, s0, m0, p0, w0] = [threadsCpu(pid), selfCpuMs(), machineCpuMs(), processesCpu(except), performance.now()];
  await during();
  const [t1, s1, m1, p1, w1] = [threadsCpu(pid), selfCpuMs(), machineCpuMs(), processesCpu(except), performance.now()];
  return { wallMs: w1 - w0, threads: delta(t0, t1), self: s1 - s0, machine: m1.busy - m0.busy, irq: m1.irq - m0.irq, steal: m1.steal - m0.steal, others: delta(p0, p1) };
}

async function main() {
  if (process.platform !== 'linux') throw new Error('daemon-threads reads /proc: Linux only');
  const d = await startDaemon(chatBenchEnv(args));
  try {
    const key = await benchKey(d, ['inference:use'], 1_000_000_000);
    const url = `${d.inferenceUrl}/api/v1/chat/completions`;
    const o = { model, maxTokens, firstToken: true };
    await streamPhase(url, key, streams, 2, o); // warm-up: the sessions' choices settle
    const idle = await measure(d.pid, () => new Promise((r) => setTimeout(r, idleSeconds * 1000)));
    let tokens = 0;
    const busy = await measure(d.pid, async () => {
      tokens = (await streamPhase(url, key, streams, seconds, o)).tokens;
    });
    if (tokens === 0) throw new Error(`no token came in the ${seconds} s phase: nothing a token to report (raise --seconds, or lower --max-tokens)`);
    const cores = os.availableParallelism();
    console.log(`machine: ${machine()}\nmodel: ${model}, ${streams} stream(s) of ${maxTokens} tokens for ${fmt(busy.wallMs / 1000, 1)} s (${tokens} tokens, ${fmt((tokens * 1000) / busy.wallMs)} tokens/s); ${cores} cores = ${fmt(cores * busy.wallMs)} CPU ms`);
    console.log('CPU ms over the idle window and over the phase; share of one core over the phase; us a token (the phase less the idle rate)');
    console.log('| thread | idle | phase | of one core | us a token |');
    console.log('| --- | --- | --- | --- | --- |');
    const row = (name: string, idleMs: number, busyMs: number) => {
      const extra = busyMs - (idleMs * busy.wallMs) / idle.wallMs;
      console.log(`| ${name} | ${fmt(idleMs)} | ${fmt(busyMs)} | ${fmt(busyMs / busy.wallMs, 2)} | ${fmt((extra * 1000) / tokens)} |`);
    };
    const listed = (ms: number) => ms >= busy.wallMs * ROW_SHARE_OF_CORE_MIN;
    // The daemon's threads by CPU in the phase; those below the row share together.
    const ranked = [...busy.threads].sort((a, b) => b[1] - a[1]);
    let restIdle = 0;
    let restBusy = 0;
    for (const [t, ms] of ranked) {
      if (t !== d.pid && !listed(ms)) {
        restIdle += idle.threads.get(t) ?? 0;
        restBusy += ms;
        continue;
      }
      row(t === d.pid ? `daemon ${t} (HTTP thread)` : `daemon ${t}`, idle.threads.get(t) ?? 0, ms);
    }
    row('daemon, its other threads', restIdle, restBusy);
    row('this benchmark (the client)', idle.self, busy.self);
    // The other processes at the row share in the phase, then interrupts, then what is left.
    const others = [...busy.others].filter(([, ms]) => listed(ms)).sort((a, b) => b[1] - a[1]);
    for (const [pid, ms] of others) row(`process ${pid} ${processNames.get(pid)}`, idle.others.get(pid) ?? 0, ms);
    row('interrupts (irq, softirq)', idle.irq, busy.irq);
    const rowsMs = (w: Window) => [...w.threads.values()].reduce((a, b) => a + b, 0) + w.self + w.irq + others.reduce((a, [pid]) => a + (w.others.get(pid) ?? 0), 0);
    row('the rest of the machine', Math.max(0, idle.machine - rowsMs(idle)), Math.max(0, busy.machine - rowsMs(busy)));
    row('stolen by the hypervisor (steal)', idle.steal, busy.steal);
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
