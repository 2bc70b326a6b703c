import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, benchKey, chatStream, envOf, fmt, latencyC1, latencyPairedC1, load, machine, startBare, sweep, wholeFlag, type LatencyC1 } from './lib.js';

// Gateway overhead: an authenticated GET through the daemon against a bare
// uWS server answering the same bytes, in one run on one machine.
// Usage: node dist/bench/gateway.js [--path /api/v1/models] [--port inference|platform] [--seconds 5]
// With --generate N (and --model ID --models-dir DIR, --threads T for ORT_INTRA_OP_THREADS, --env 'K=V,...' for other settings, --rounds R):
// N streaming chat clients generate the whole time, and only the concurrency-1
// latencies are taken (gateway and bare server alike share the cores with the
// model workers): the gateway's added p99 while the engine is busy.

const args = benchArgs();
const target = args.get('port') ?? 'platform';
const routePath = args.get('path') ?? (target === 'platform' ? '/api/v1/user/teams' : '/api/v1/models');
const seconds = Number(args.get('seconds') ?? 5);
const P99_MS_MAX = 10; // the latency bound the throughput figure is quoted at
const generate = wholeFlag(args, 'generate', 0, 0);
const rounds = wholeFlag(args, 'rounds', 3, 1); // with --generate: rounds of request pairs during the load
/**
 * With --generate, the latencies are taken once every stream has finished this many requests:
 * in the first ~3.5 s after 16 streams start at once, a p99 over 1,500 requests was 0.8-3.1 ms,
 * after it 0.1-0.7 with a rare 1.0-1.4 (m25 int4, bench/README.md "Gateway p99: the start of the
 * load").
 */
const READY_AFTER_REQUESTS = 2;
/**
 * Requests the probe sends each server under the load before the measured rounds: with the
 * gateway always first, its first round's p99 was 1.5-4 ms where later rounds read 0.3-1 ms,
 * and with the bare server first the bare server's was (2.0 and 2.3 ms against 0.2-0.8 after):
 * the probe's own start, not either server's cost (bench/README.md "The probe's first round").
 */
const PROBE_WARM_REQUESTS = 2000;

/**
 * `n` clients streaming 64-token chat completions back to back until stopped,
 * on their own thread (parsing their streams must not delay the latency
 * client's event loop); `mark` starts the count, `stop` answers the completion tokens of the
 * requests they finished since.
 */
function generators(d: { inferenceUrl: string }, key: string, n: number, model: string): { ready: Promise<void>; mark: () => void; stop: () => Promise<number> } {
  const w = new Worker(new URL(import.meta.url), { workerData: { inferenceUrl: d.inferenceUrl, key, n, model } });
  let ready!: () => void;
  let failed!: (e: unknown) => void;
  const isReady = new Promise<void>((r, j) => ((ready = r), (failed = j)));
  const done = new Promise<number>((resolve, reject) => {
    w.on('message', (m: { ready: true } | { tokens: number }) => {
      if ('ready' in m) ready();
      else void w.terminate().then(() => resolve(m.tokens));
    });
    // A stream that fails (a model the daemon does not serve: 404) ends the worker. Both promises
    // reject, so the caller's `finally` blocks stop the bare server and the daemon; `done` is marked
    // handled until `stop` awaits it, or its rejection alone would end the process with them running.
    w.once('error', (e) => (failed(e), reject(e)));
  });
  done.catch(() => undefined);
  return { ready: isReady, mark: () => w.postMessage('mark'), stop: async () => (w.postMessage('stop'), done) };
}

/** `n` streams generating; `ready` once every one has finished two requests (the clients started, the batch in its cycle). */
function generateHere(d: { inferenceUrl: string }, key: string, n: number, model: string): { ready: Promise<void>; mark: () => void; stop: () => Promise<number> } {
  let stopping = false;
  let tokens = 0;
  let marked = 0;
  let finishedTwo = 0;
  let ready!: () => void;
  const isReady = new Promise<void>((r) => (ready = r));
  const one = async () => {
    for (let done = 0; !stopping; ) {
      // The benchmarks' light client (lib.ts chatStream): fetch's stream machinery took ~2.7 s of
      // CPU in 10 s for 16 streams, CPU the daemon's HTTP thread then waited for.
      const r = await chatStream(`${d.inferenceUrl}/v1/chat/completions`, key, 'Once upon a time', { model, maxTokens: 64, firstToken: false });
      if (!r.tokens) throw new Error('a chat stream ended without its usage');
      tokens += r.tokens; // not `tokens += await ...`: that reads the sum before the await
      if (++done === READY_AFTER_REQUESTS && ++finishedTwo === n) ready();
    }
  };
  const all = Promise.all(Array.from({ length: n }, one));
  return { ready: isReady, mark: () => void (marked = tokens), stop: async () => ((stopping = true), await all, tokens - marked) };
}

async function busy(): Promise<void> {
  const env: Record<string, string> = { RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0' };
  if (args.has('models-dir')) env.MODELS_DIR = args.get('models-dir')!;
  if (args.has('threads')) env.ORT_INTRA_OP_THREADS = args.get('threads')!;
  Object.assign(env, envOf(args.get('env')));
  if (process.env.DAEMON_NODE_OPTIONS) env.NODE_OPTIONS = process.env.DAEMON_NODE_OPTIONS;
  const model = args.get('model') ?? 'cloudgate/stories260k';
  const d = await startDaemon(env);
  try {
    const key = await benchKey(d, ['inference:use'], 1_000_000_000);
    const headers = { authorization: `Bearer ${key}` };
    const busyPath = args.get('path') ?? '/api/v1/models';
    const url = d.inferenceUrl + busyPath;
    const first = await fetch(url, { headers });
    const body = await first.text();
    const bare = await startBare(body, first.headers.get('content-type') ?? 'application/json');
    try {
      const n = Math.max(2000, seconds * 400);
      // The first few thousand requests after a start run slower at the tail (p99 2 ms falling
      // to 0.4 ms over three runs of 3,000): compiled code and caches warming. Not measured.
      await latencyC1(url, headers, 6000);
      await latencyC1(bare.url, headers, 2000);
      const [idleGw, idleBare] = await latencyPairedC1([url, bare.url], headers, n);
      const gen = generators(d, key, generate, model);
      // Measured once every stream has finished two requests, a second after: the first seconds of
      // 16 clients starting at once (their own start-up, the chat path's first compilation, the
      // first steps of each shape) are a start, not the load (bench/README.md "Gateway p99: the
      // start of the load").
      const t00 = performance.now();
      await gen.ready;
      await new Promise((r) => setTimeout(r, 1000));
      // The probe's own start under the load, not measured: whichever server it measured first
      // took a p99 2-3x its later rounds (bench/README.md "The probe's first round").
      await latencyPairedC1([url, bare.url], headers, PROBE_WARM_REQUESTS);
      const startMs = performance.now() - t00;
      const t0 = performance.now();
      gen.mark(); // the rate below is over the measurement only, not the start before it
      // Each round sends the two servers requests in pairs, so both meet the same moments of the
      // load (lib.ts latencyPairedC1); the figure is the p99 of all the rounds' requests
      // together, and each round's is shown too.
      const gws: LatencyC1[] = [];
      const bss: LatencyC1[] = [];
      for (let r = 0; r < rounds; r++) {
        const [g, b] = await latencyPairedC1([url, bare.url], headers, n);
        gws.push(g);
        bss.push(b);
      }
      const tokens = await gen.stop();
      const secs = (performance.now() - t0) / 1000;
      const pooled = (runs: typeof gws) => {
        const all = Float64Array.from(runs.flatMap((x) => [...x.samplesUs])).sort();
        return { p50Us: all[all.length >> 1]!, p99Us: all[Math.floor(all.length * 0.99)]! };
      };
      const [gw, bs] = [pooled(gws), pooled(bss)];
      console.log(
        [
          `machine: ${machine()}`,
          `GET ${busyPath} at concurrency 1 (${n} requests per figure), ${model}, ORT_INTRA_OP_THREADS=${env.ORT_INTRA_OP_THREADS ?? 'default'}, MODEL_THREADS_NICE=${process.env.MODEL_THREADS_NICE ?? 'default'}`,
          `idle: gateway p50 ${fmt(idleGw.p50Us)} us p99 ${fmt(idleGw.p99Us)} us | bare p50 ${fmt(idleBare.p50Us)} us p99 ${fmt(idleBare.p99Us)} us | added p99 ${fmt((idleGw.p99Us - idleBare.p99Us) / 1000, 3)} ms`,
          `${generate} streams generating, measured from ${fmt(startMs / 1000, 1)} s after they started, ${rounds} rounds of ${n} request pairs (~${fmt(tokens / secs)} tokens/s over the measurement): gateway p50 ${fmt(gw.p50Us)} us p99 ${fmt(gw.p99Us)} us | bare p50 ${fmt(bs.p50Us)} us p99 ${fmt(bs.p99Us)} us | added p99 ${fmt((gw.p99Us - bs.p99Us) / 1000, 3)} ms`,
          `  each round's added p99 (ms; requests in pairs, one to each server): ${gws.map((g, i) => fmt((g.p99Us - bss[i]!.p99Us) / 1000, 3)).join(', ')}`,
        ].join('\n'),
      );
    } finally {
      bare.proc.kill();
    }
  } finally {
    await stopDaemon(d);
  }
}

async function main() {
  if (!isMainThread) {
    const { inferenceUrl, key, n, model } = workerData as { inferenceUrl: string; key: string; n: number; model: string };
    const gen = generateHere({ inferenceUrl }, key, n, model);
    void gen.ready.then(() => parentPort!.postMessage({ ready: true }));
    parentPort!.on('message', async (m: 'mark' | 'stop') => {
      if (m === 'mark') gen.mark();
      else parentPort!.postMessage({ tokens: await gen.stop() });
    });
    return;
  }
  if (generate > 0) return busy();
  const d = await startDaemon(); // production settings: info logs, one line per request
  try {
    const key = await benchKey(d, ['teams:read', 'instances:read', 'inference:use', 'billing:read']);
    const headers = { authorization: `Bearer ${key}` };
    const url = (target === 'platform' ? d.platformUrl : d.inferenceUrl) + routePath;
    const first = await fetch(url, { headers });
    const body = await first.text();
    if (first.status !== 200) throw new Error(`${routePath} answered ${first.status}: ${body}`);
    const bare = await startBare(body, first.headers.get('content-type') ?? 'application/json');
    try {
      // warm both
      await load(url, headers, 4, 1);
      await load(bare.url, headers, 4, 1);
      const n = Math.max(2000, seconds * 2000);
      const gw1 = await latencyC1(url, headers, n);
      const bare1 = await latencyC1(bare.url, headers, n);
      const gw = await sweep(url, headers, seconds, P99_MS_MAX);
      const bs = await sweep(bare.url, headers, seconds, P99_MS_MAX);
      const lines = [
        `machine: ${machine()}`,
        `route: GET ${routePath} on the ${target} port (${body.length} bytes), authenticated`,
        `concurrency 1 (${n} sequential requests): gateway p50 ${fmt(gw1.p50Us)} us p99 ${fmt(gw1.p99Us)} us | bare p50 ${fmt(bare1.p50Us)} us p99 ${fmt(bare1.p99Us)} us | added p99 ${fmt((gw1.p99Us - bare1.p99Us) / 1000, 3)} ms`,
        ...gw.runs.map((r) => `  gateway c=${r.connections}: ${fmt(r.rps)} req/s p50 ${r.p50} p99 ${r.p99} ms errors ${r.errors} non2xx ${r.non2xx}`),
        ...bs.runs.map((r) => `  bare    c=${r.connections}: ${fmt(r.rps)} req/s p50 ${r.p50} p99 ${r.p99} ms`),
        `best at p99 <= ${P99_MS_MAX} ms: gateway ${fmt(gw.best?.rps ?? 0)} req/s (c=${gw.best?.connections}), bare ${fmt(bs.best?.rps ?? 0)} req/s (c=${bs.best?.connections}), ratio ${fmt((gw.best?.rps ?? 0) / (bs.best?.rps ?? 1), 2)}`,
      ];
      console.log(lines.join('\n'));
    } finally {
      bare.proc.kill();
    }
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
