import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { benchArgs, benchKey, chatStream, fmt, machine, secondsFlag, wholeFlag } from './lib.js';

// What the daemon's HTTP thread allocates a generated token, by the function that allocates it:
// the sampling heap profile of V8's inspector (Chrome DevTools protocol), objects that the young
// generation's scavenges collected counted too, while N streams generate; and before it, in a
// window as long, how many scavenges that thread ran a token. Every byte allocated
// brings that thread's next scavenge (a pause of ~3-6 ms on a slow machine) closer, and a request
// that arrives during one waits for it: the gateway's added p99 under load (bench/README.md
// "Per-token metrics without garbage").
// Usage: node dist/bench/token-garbage.js [--model ID --models-dir DIR] [--streams 16] [--seconds 8] [--top 20]
//   [--root DIR]: the checkout whose daemon runs (built; this one by default), to set two builds side by side.

// Node 20 has the WebSocket client the inspector speaks behind a flag: run again with it.
if (!('WebSocket' in globalThis)) {
  const r = spawnSync(process.execPath, ['--experimental-websocket', ...process.argv.slice(1)], { stdio: 'inherit' });
  process.exit(r.status ?? 1);
}

const args = benchArgs();
const streams = wholeFlag(args, 'streams', 16, 1);
const seconds = secondsFlag(args, 'seconds', 8, 1);
const top = wholeFlag(args, 'top', 20, 0);
const model = args.get('model') ?? 'cloudgate/stories260k';
const root = path.resolve(args.get('root') ?? path.join(import.meta.dirname, '..', '..'));
/** Streams run this long before the profile starts: the clients connected, the batch in its cycle, compiled code warm. */
const WARM_MS = 3000;
/** The profile's sampling interval: an allocation is recorded about once every this many bytes. */
const SAMPLING_INTERVAL_BYTES = 256;

/** Counts the daemon main thread's scavenges from here on (evaluated there through the inspector). */
const GC_COUNTER = `(() => {
  const { PerformanceObserver, constants } = process.getBuiltinModule('node:perf_hooks');
  const c = (globalThis.__tokenGarbageGc = { n: 0, ms: 0, maxMs: 0 });
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      if (e.detail?.kind !== constants.NODE_PERFORMANCE_GC_MINOR) continue;
      c.n++;
      c.ms += e.duration;
      c.maxMs = Math.max(c.maxMs, e.duration);
    }
  }).observe({ entryTypes: ['gc'] });
})()`;

interface ProfileNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: ProfileNode[];
}

async function main() {
  const { startDaemon, stopDaemon } = (await import(path.join(root, 'dist', 'test', 'daemon.js'))) as typeof import('../test/daemon.js');
  // Port 0: the system picks a free one, and Node writes the inspector's address to the daemon's log.
  process.env.DAEMON_NODE_ARGS = [process.env.DAEMON_NODE_ARGS, '--inspect=127.0.0.1:0'].filter(Boolean).join(' ');
  const env: Record<string, string> = { RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0' };
  if (args.has('models-dir')) env.MODELS_DIR = args.get('models-dir')!;
  const d = await startDaemon(env);
  try {
    const key = await benchKey(d, ['inference:use'], 1_000_000_000);
    const inspector = /Debugger listening on (ws:\/\/\S+)/.exec(fs.readFileSync(d.logFile, 'utf8'))?.[1];
    if (!inspector) throw new Error(`the daemon did not say where its inspector listens (log: ${d.logFile})`);
    const ws = new WebSocket(inspector);
    await new Promise((r, j) => (ws.addEventListener('open', r), ws.addEventListener('error', j)));
    let id = 0;
    const answers = new Map<number, (m: { result?: unknown; error?: { message: string } }) => void>();
    ws.addEventListener('message', (e) => {
      const m = JSON.parse(String(e.data)) as { id?: number; result?: unknown; error?: { message: string } };
      if (m.id !== undefined) answers.get(m.id)?.(m);
    });
    // A method the inspector refuses answers with `error`: said as such, not read as an empty result.
    const call = (method: string, params = {}) =>
      new Promise<{ result: unknown }>((resolve, reject) => {
        answers.set(++id, (m) => (m.error ? reject(new Error(`inspector ${method}: ${m.error.message}`)) : resolve({ result: m.result })));
        ws.send(JSON.stringify({ id, method, params }));
      });

    let stopping = false;
    let counting = false;
    let tokens = 0;
    const one = async () => {
      while (!stopping) {
        const r = await chatStream(`${d.inferenceUrl}/v1/chat/completions`, key, 'Once upon a time', { model, maxTokens: 64, firstToken: false });
        if (counting) tokens += r.tokens;
      }
    };
    const all = Promise.all(Array.from({ length: streams }, one));
    await new Promise((r) => setTimeout(r, WARM_MS));

    // First window: the HTTP thread's scavenges, counted in the daemon by a PerformanceObserver
    // the inspector installs (no profile running: its sampling would change what is timed).
    const evaluate = async (expression: string) => ((await call('Runtime.evaluate', { expression, returnByValue: true })).result as { result: { value: unknown } }).result.value;
    await evaluate(GC_COUNTER);
    counting = true;
    await new Promise((r) => setTimeout(r, seconds * 1000));
    const gc = JSON.parse(String(await evaluate('JSON.stringify(globalThis.__tokenGarbageGc)'))) as { n: number; ms: number; maxMs: number };
    const gcTokens = tokens;
    if (!gcTokens) throw new Error('no token was generated while the scavenges were counted');
    tokens = 0;

    await call('HeapProfiler.enable');
    await call('HeapProfiler.startSampling', { samplingInterval: SAMPLING_INTERVAL_BYTES, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true });
    counting = true;
    await new Promise((r) => setTimeout(r, seconds * 1000));
    const { profile } = (await call('HeapProfiler.stopSampling')).result as { profile: { head: ProfileNode } };
    counting = false;
    stopping = true;
    await all;
    ws.close();

    const bytesBy = new Map<string, number>();
    let total = 0;
    const walk = (n: ProfileNode) => {
      const f = n.callFrame;
      const where = `${f.functionName || '(anonymous)'} ${f.url.replace(/^.*?\/(src|dist|node_modules)\//, '$1/')}:${f.lineNumber + 1}`;
      bytesBy.set(where, (bytesBy.get(where) ?? 0) + n.selfSize);
      total += n.selfSize;
      n.children.forEach(walk);
    };
    walk(profile.head);
    if (!tokens) throw new Error('no token was generated while the profile ran');
    console.log(`machine: ${machine()}\ncheckout: ${root}\nmodel: ${model}, ${streams} streams, ${seconds} s profiled: ${fmt(tokens)} tokens (${fmt(tokens / seconds)} a second)`);
    console.log(`the HTTP thread's scavenges (young-generation collections), ${fmt(gcTokens)} tokens in the ${seconds} s before the profile: ${gc.n}, ${fmt((gc.n * 1000) / gcTokens, 2)} per 1,000 tokens; ${fmt(gc.ms, 1)} ms in all, the longest ${fmt(gc.maxMs, 2)} ms`);
    console.log(`the HTTP thread allocated ${fmt(total / 1e6, 1)} MB while profiled: ${fmt(total / tokens)} B a token`);
    for (const [where, bytes] of [...bytesBy].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${fmt(bytes / tokens).padStart(6)} B a token  ${where}`);
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
