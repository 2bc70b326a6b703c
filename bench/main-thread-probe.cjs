// What the daemon's main thread (HTTP, SSE, scheduler) spends its time on while a
// benchmark runs: a preload for the daemon, given to bench/gateway.js as
//   DAEMON_NODE_OPTIONS='--require /path/to/bench/main-thread-probe.cjs'
// Every SIGUSR2 (`kill -USR2 <daemon pid>`) appends one line to MAIN_THREAD_PROBE_FILE
// (default /tmp/cloudgate-main-thread.txt) covering the time since the last one:
// event-loop utilisation, event-loop delay percentiles, and the garbage collections
// (scavenges: count, mean and longest pause; others by V8 kind and pause).
// CommonJS and outside the TypeScript build: `--require` loads it before the daemon.
const { isMainThread } = require('node:worker_threads');
const { monitorEventLoopDelay, performance, PerformanceObserver } = require('node:perf_hooks');
const fs = require('node:fs');

const SCAVENGE = 1; // perf_hooks gc kind of a minor collection
const file = process.env.MAIN_THREAD_PROBE_FILE ?? '/tmp/cloudgate-main-thread.txt';

if (isMainThread && (process.argv[1] ?? '').endsWith('main.js')) {
  const delay = monitorEventLoopDelay({ resolution: 1 });
  delay.enable();
  const gcs = [];
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) gcs.push([e.detail?.kind ?? e.kind, e.duration]);
  }).observe({ entryTypes: ['gc'] });
  let elu = performance.eventLoopUtilization();
  const started = Date.now();
  process.on('SIGUSR2', () => {
    const u = performance.eventLoopUtilization(elu);
    elu = performance.eventLoopUtilization();
    const sc = gcs.filter(([k]) => k === SCAVENGE).map(([, d]) => d);
    const others = gcs.filter(([k]) => k !== SCAVENGE).map(([k, d]) => `kind ${k} ${d.toFixed(1)} ms`);
    const ms = (ns) => (ns / 1e6).toFixed(2);
    fs.appendFileSync(
      file,
      `${((Date.now() - started) / 1000).toFixed(1)} s: event loop busy ${(u.utilization * 100).toFixed(1)}%, ` +
        `delay p50 ${ms(delay.percentile(50))} p99 ${ms(delay.percentile(99))} max ${ms(delay.max)} ms; ` +
        `${sc.length} scavenges, mean ${(sc.reduce((a, b) => a + b, 0) / (sc.length || 1)).toFixed(2)} ms, longest ${Math.max(0, ...sc).toFixed(2)} ms` +
        `${others.length ? `; other collections: ${others.join(', ')}` : ''}\n`,
    );
    gcs.length = 0;
    delay.reset();
  });
}
