// The long fault runs (issue 12), each against fresh daemons on this machine, traffic to
// 127.0.0.1 only, bounded in time and count. The short versions are test/faults/*.test.ts.
//
//   node dist/bench/faults.js oversized   /healthz latency while 16 MiB / 4 MiB bodies are refused
//   node dist/bench/faults.js stall       /readyz and platform latency with PostgreSQL stopped (SIGSTOP)
//   node dist/bench/faults.js flood       admitted-request wait and refusal latency under a flood
//   node dist/bench/faults.js burst [DIR:MODEL]  a burst past the free slots into a fresh model and
//                                         into one idle long enough to have no rate of endings
//   node dist/bench/faults.js kill [n]    n kill -9 cycles under chat load: charges lost per kill
//   node dist/bench/faults.js dbdown      SIGTERM with the database dead: time, exit code, charges kept
//   node dist/bench/faults.js idle        how long an idle / half-sent connection is held
//   node dist/bench/faults.js soak [min]  mixed load for `min` minutes, RSS every 10 s
import fs from 'node:fs';
import net from 'node:net';
import { Worker } from 'node:worker_threads';
import { embeddedPostgresPids, fundedKey, startDaemon, stopDaemon, type Started } from '../test/daemon.js';
import { machine } from './lib.js';

const CHAT = 'cloudgate/random-llama-chat';
const EVAL = 'cloudgate/random-llama-eval';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]! : NaN;
};
const ms = (x: number) => `${x.toFixed(1)} ms`;

async function post(d: Started, base: 'platform' | 'inference', p: string, key: string, body: unknown) {
  const r = await fetch(`${base === 'platform' ? d.platformUrl : d.inferenceUrl}${p}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : undefined, headers: r.headers };
}

/** A user with a key (no rate limit to speak of) and `funds` units in the wallet. */
const user = (d: Started, funds: number) =>
  fundedKey(d, funds, ['inference:use', 'billing:read', 'instances:read'], { requestsPerMinute: 1_000_000, tokensPerMinute: 1_000_000_000 });

/**
 * Polls `url` every `everyMs` from a worker thread (so this thread's own work, such as
 * uploading a 16 MiB body, does not count against the daemon) until `stop()`.
 */
function prober(url: string, everyMs = 10) {
  const code = `
    const { parentPort, workerData } = require('node:worker_threads');
    let stop = false;
    const lat = [];
    parentPort.on('message', () => (stop = true));
    (async () => {
      while (!stop) {
        const t0 = performance.now();
        try { await (await fetch(workerData.url)).text(); } catch {}
        lat.push(performance.now() - t0);
        await new Promise((r) => setTimeout(r, workerData.everyMs));
      }
      parentPort.postMessage(lat);
    })();`;
  const w = new Worker(code, { eval: true, workerData: { url, everyMs } });
  const lat: number[] = [];
  const done = new Promise<void>((r) => w.once('message', (l: number[]) => (lat.push(...l), r())));
  return {
    lat,
    stop: async () => {
      w.postMessage('stop');
      await done;
      await w.terminate();
    },
  };
}

const postgresPids = (d: Started) => embeddedPostgresPids(d.dataDir);

const rssMiB = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

/** Units charged so far (read back from the wallet). */
async function charged(d: Started, key: string, funds: number) {
  const r = await fetch(`${d.platformUrl}/api/v1/billing/wallet`, { headers: { authorization: `Bearer ${key}` } });
  const w = (await r.json()) as { balance_usd: number };
  return funds - Math.round(w.balance_usd * 10_000);
}

const chatBody = (maxTokens: number, stream = false) => ({ model: CHAT, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: maxTokens, temperature: 0, stream });
// random-llama-chat's prices, as micro-USD per token (see test/faults/charges.test.ts).
const owed = (u: { prompt_tokens: number; completion_tokens: number }) => 100_000 * u.prompt_tokens + 200_000 * u.completion_tokens;

/**
 * Reads a stream to its end; when its first content token came, in ms from `t0`. That ends the
 * wait for a slot (and the prefill).
 */
async function firstTokenMs(r: Response, t0: number): Promise<number | undefined> {
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  let at: number | undefined;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return at;
    if (at === undefined && /"content":"[^"]/.test(dec.decode(value))) at = performance.now() - t0;
  }
}

/** Runs `f` against a fresh daemon, stopped (gracefully) however `f` ends. */
async function withDaemon(f: (d: Started) => Promise<void>): Promise<void> {
  const d = await startDaemon();
  try {
    await f(d);
  } finally {
    await stopDaemon(d);
  }
}

const runs: Record<string, (arg?: string) => Promise<void>> = {
  async oversized() {
    await withDaemon(async (d) => {
      const { key } = await user(d, 100_000);
      const chat = JSON.stringify({ model: CHAT, messages: [{ role: 'user', content: 'once upon a time '.repeat((4 * 1024 * 1024 - 1024) / 17) }] });
      const evaluation = JSON.stringify({ model: EVAL, state: 'the cat sat on the mat. '.repeat((16 * 1024 * 1024 - 1024) / 24), questions: { q: { type: 'boolean' } } });
      const base = prober(`${d.inferenceUrl}/healthz`);
      await sleep(2000);
      await base.stop();
      // prom-client's event-loop lag histogram restarts at each scrape: this one opens the window.
      const lagMax = async () => Number(/^nodejs_eventloop_lag_max_seconds (\S+)$/m.exec(await (await fetch(`${d.platformUrl}/metrics`)).text())![1]) * 1000;
      await lagMax();
      const p = prober(`${d.inferenceUrl}/healthz`);
      const t0 = performance.now();
      const rs = await Promise.all([
        post(d, 'inference', '/v1/chat/completions', key, chat),
        post(d, 'inference', '/v1/evaluations', key, evaluation),
        post(d, 'inference', '/v1/chat/completions', key, chat),
        post(d, 'inference', '/v1/evaluations', key, evaluation),
      ]);
      const took = performance.now() - t0;
      await p.stop();
      const lag = await lagMax();
      console.log(`refusals: ${rs.map((r) => `${r.status} ${r.body.error?.code}`).join(', ')} in ${ms(took)}`);
      console.log(`/healthz idle:    p50 ${ms(pct(base.lat, 50))}  p99 ${ms(pct(base.lat, 99))}  max ${ms(Math.max(...base.lat))}  (${base.lat.length} probes)`);
      console.log(`/healthz refusing: p50 ${ms(pct(p.lat, 50))}  p99 ${ms(pct(p.lat, 99))}  max ${ms(Math.max(...p.lat))}  (${p.lat.length} probes)`);
      console.log(`daemon event loop, longest delay while refusing: ${ms(lag)} (nodejs_eventloop_lag_max_seconds, 10 ms resolution)`);
    });
  },

  async stall() {
    await withDaemon(async (d) => {
      const { key } = await user(d, 100_000);
      await post(d, 'inference', '/v1/chat/completions', key, chatBody(4));
      const pids = postgresPids(d);
      for (const p of pids) process.kill(p, 'SIGSTOP');
      const stoppedAt = performance.now();
      let notReadyAfter = NaN;
      // /readyz polled on its own every 20 ms: when it first says 503.
      const watch = (async () => {
        while (Number.isNaN(notReadyAfter) && performance.now() - stoppedAt < 10_000) {
          if ((await fetch(`${d.platformUrl}/readyz`)).status === 503) notReadyAfter = performance.now() - stoppedAt;
          else await sleep(20);
        }
      })();
      const ready: number[] = [];
      const wallet: Array<[number, number]> = [];
      const infer: Array<[number, number]> = [];
      const health: number[] = [];
      const until = performance.now() + 10_000;
      while (performance.now() < until) {
        const t = (f: () => Promise<number>) => {
          const t0 = performance.now();
          return f().then((s) => [s, performance.now() - t0] as [number, number]);
        };
        const [r, w, i, h] = await Promise.all([
          t(async () => (await fetch(`${d.platformUrl}/readyz`)).status),
          t(async () => (await fetch(`${d.platformUrl}/api/v1/billing/wallet`, { headers: { authorization: `Bearer ${key}` } })).status),
          t(async () => (await post(d, 'inference', '/v1/chat/completions', key, chatBody(4))).status),
          t(async () => (await fetch(`${d.platformUrl}/healthz`)).status),
        ]);
        ready.push(r[1]);
        wallet.push(w);
        infer.push(i);
        health.push(h[1]);
      }
      await watch;
      for (const p of pids) process.kill(p, 'SIGCONT');
      const show = (name: string, xs: Array<[number, number]>) =>
        console.log(`${name}: statuses ${[...new Set(xs.map((x) => x[0]))].join('/')}  p50 ${ms(pct(xs.map((x) => x[1]), 50))}  max ${ms(Math.max(...xs.map((x) => x[1])))}  (${xs.length})`);
      console.log(`10 s with PostgreSQL stopped (SIGSTOP on the postmaster and its ${pids.length - 1} backends):`);
      console.log(`/readyz: 503 from ${ms(notReadyAfter)} after the stop (first probe that saw it); answers p50 ${ms(pct(ready, 50))}  max ${ms(Math.max(...ready))}`);
      show('GET /api/v1/billing/wallet', wallet);
      show('chat (admitted key, cached balance)', infer);
      console.log(`/healthz: max ${ms(Math.max(...health))}`);
    });
  },

  async flood() {
    await withDaemon(async (d) => {
      const { key } = await user(d, 100_000_000);
      await post(d, 'inference', '/v1/chat/completions', key, chatBody(16));
      const SECONDS = 40;
      const CLIENTS = 128;
      const waits: number[] = [];
      const refusals: number[] = [];
      const codes = new Map<string, number>();
      // Refusals after the first burst (128 connections opened at once queue on the event loop).
      const later: number[] = [];
      const start = performance.now();
      const until = start + SECONDS * 1000;
      // Each client sends its next stream as soon as the last ended, or after the Retry-After of a
      // refusal: a sustained flood past what the model serves (128 streams of 480 tokens, 64 slots).
      const client = async () => {
        while (performance.now() < until) {
          const t0 = performance.now();
          const r = await fetch(`${d.inferenceUrl}/v1/chat/completions`, {
            method: 'POST',
            headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
            body: JSON.stringify({ ...chatBody(480, true), logit_bias: { '2': -100 } }),
          });
          if (r.status !== 200) {
            const code = ((await r.json()) as { error?: { code?: string } }).error?.code ?? String(r.status);
            refusals.push(performance.now() - t0);
            if (t0 > start + 2_000) later.push(performance.now() - t0);
            codes.set(code, (codes.get(code) ?? 0) + 1);
            // As the official SDKs do: wait what Retry-After says (here at most 2 s, to keep the pressure on).
            await sleep(Math.min(2_000, Number(r.headers.get('retry-after-ms') ?? 1_000)));
            continue;
          }
          const wait = await firstTokenMs(r, t0);
          if (wait !== undefined) waits.push(wait);
        }
      };
      await Promise.all(Array.from({ length: CLIENTS }, client));
      console.log(`${CLIENTS} clients streaming 480 tokens back to back for ${SECONDS} s (ADMISSION_WAIT_MS_MAX 10 s):`);
      console.log(`admitted ${waits.length}: wait to first token p50 ${ms(pct(waits, 50))}  p99 ${ms(pct(waits, 99))}  max ${ms(Math.max(...waits))}`);
      console.log(`refused ${refusals.length} (${[...codes].map(([c, n]) => `${n} ${c}`).join(', ')}): p50 ${ms(pct(refusals, 50))}  p99 ${ms(pct(refusals, 99))}  max ${ms(Math.max(...refusals))}; after the opening burst p50 ${ms(pct(later, 50))}  p99 ${ms(pct(later, 99))}`);
    });
  },

  async burst(arg) {
    // A fresh daemon (or one idle for a while: no rate of endings to go by) sent many more
    // streams at once than it has batch slots, each client once: how many are let in, and how
    // long those wait for their first token against ADMISSION_WAIT_MS_MAX (10 s).
    const at = arg?.lastIndexOf(':') ?? -1;
    if (arg !== undefined && at <= 0) throw new Error(`burst: DIR:MODEL (a models folder and a model id in it), got '${arg}'`);
    const [dir, model] = arg ? [arg.slice(0, at), arg.slice(at + 1)] : [undefined, CHAT];
    const d = await startDaemon(dir ? { MODELS_DIR: dir, RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0' } : {});
    try {
      const { key } = await user(d, 1_000_000_000);
      const CLIENTS = 192; // three batches' worth at the default 64 slots
      const MAX_TOKENS = 64;
      // Long enough that the ~200 endings of a burst (decayed over 10 s) fall under the 4 a rate needs.
      const IDLE_S = 50;
      const burst = async (label: string) => {
        const waits: number[] = [];
        const codes = new Map<string, number>();
        const t0 = performance.now();
        await Promise.all(
          Array.from({ length: CLIENTS }, async (_, i) => {
            const r = await fetch(`${d.inferenceUrl}/v1/chat/completions`, {
              method: 'POST',
              headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
              body: JSON.stringify({ model, messages: [{ role: 'user', content: `Once upon a time ${i}` }], max_tokens: MAX_TOKENS, temperature: 0, stream: true, logit_bias: { '2': -100 } }),
            });
            if (r.status !== 200) {
              const code = ((await r.json()) as { error?: { code?: string } }).error?.code ?? String(r.status);
              codes.set(code, (codes.get(code) ?? 0) + 1);
              return;
            }
            const wait = await firstTokenMs(r, t0);
            if (wait !== undefined) waits.push(wait);
          }),
        );
        const all = (performance.now() - t0) / 1000;
        console.log(`${label}: ${CLIENTS} streams of ${MAX_TOKENS} tokens at once: admitted ${waits.length}, refused ${CLIENTS - waits.length} (${[...codes].map(([c, n]) => `${n} ${c}`).join(', ') || 'none'}); first token p50 ${ms(pct(waits, 50))}  p99 ${ms(pct(waits, 99))}  max ${ms(Math.max(...waits))}; all done in ${all.toFixed(1)} s`);
      };
      await burst(`fresh (${model})`);
      await sleep(IDLE_S * 1000);
      await burst(`after ${IDLE_S} s idle`);
    } finally {
      await stopDaemon(d);
    }
  },

  async kill(arg) {
    const cycles = Number(arg ?? 5);
    let d = await startDaemon();
    const FUNDS = 10_000_000;
    const { key } = await user(d, FUNDS);
    let owedMicro = 0;
    const lost: number[] = [];
    try {
      for (let c = 0; c < cycles; c++) {
        let stop = false;
        const workers = Array.from({ length: 8 }, async () => {
          while (!stop) {
            const r = await post(d, 'inference', '/v1/chat/completions', key, chatBody(32)).catch(() => undefined);
            if (r?.status === 200) owedMicro += owed(r.body.usage);
          }
        });
        await sleep(2000 + Math.random() * 1000);
        d.proc.kill('SIGKILL');
        stop = true;
        await Promise.all(workers);
        await d.exited;
        d = await startDaemon({ ADMIN_API_KEY: d.adminKey }, d.dataDir);
        // Units are charged in whole units of the summed micro-USD (charger.ts): compare in units.
        const want = Math.round(owedMicro / 100_000_000);
        const got = await charged(d, key, FUNDS);
        lost.push(want - got);
        console.log(`cycle ${c + 1}: answered usage ${want} units, charged ${got} units, lost ${want - got}`);
      }
      console.log(`kill -9 x ${cycles}: units lost per kill ${lost.join(', ')} (a completion answered in the last instant before the kill may round either way)`);
    } finally {
      await stopDaemon(d);
    }
  },

  async dbdown() {
    const d = await startDaemon({ CHARGE_FLUSH_INTERVAL_MS: '600000' });
    const FUNDS = 10_000_000;
    const { key } = await user(d, FUNDS);
    let owedMicro = 0;
    for (let i = 0; i < 40; i++) owedMicro += owed((await post(d, 'inference', '/v1/chat/completions', key, chatBody(32))).body.usage);
    for (const p of postgresPids(d)) process.kill(p, 'SIGKILL');
    const t0 = performance.now();
    d.proc.kill('SIGTERM');
    const code = await d.exited;
    const took = performance.now() - t0;
    const again = await startDaemon({ ADMIN_API_KEY: d.adminKey }, d.dataDir);
    try {
      const want = Math.round(owedMicro / 100_000_000);
      console.log(`SIGTERM with PostgreSQL dead: stopped in ${ms(took)}, exit code ${code}`);
      console.log(`charges: owed ${want} units, posted at the next start ${await charged(again, key, FUNDS)} units`);
    } finally {
      await stopDaemon(again);
    }
  },

  async idle() {
    await withDaemon(async (d) => {
      const port = Number(new URL(d.platformUrl).port);
      const held = (send: string) =>
        new Promise<number>((r) => {
          const t0 = performance.now();
          const s = net.connect(port, '127.0.0.1', () => s.write(send));
          s.on('data', () => undefined);
          s.on('close', () => r(performance.now() - t0));
          s.on('error', () => undefined);
        });
      const [idle, header] = await Promise.all([held(''), held('GET /healthz HTTP/1.1\r\nhost: x\r\n')]);
      console.log(`connection sending nothing closed after ${ms(idle)}; half a request head: ${ms(header)} (uWebSockets' fixed 10 s idle timeout)`);
    });
  },

  async soak(arg) {
    const minutes = Number(arg ?? 10);
    await withDaemon(async (d) => {
      const { key } = await user(d, 100_000_000);
      const until = performance.now() + minutes * 60_000;
      let requests = 0;
      const mix = [
        () => post(d, 'inference', '/v1/chat/completions', key, { ...chatBody(64), messages: [{ role: 'user', content: `story ${requests} ${'x '.repeat(requests % 200)}` }] }),
        () => fetch(`${d.inferenceUrl}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(chatBody(64, true)) }).then((r) => r.text()),
        () => post(d, 'inference', '/v1/evaluations', key, { model: EVAL, state: `state ${requests} ${'y '.repeat(requests % 150)}`, questions: { a: { type: 'boolean' }, b: { type: 'score', criteria: ['low', 'mid', 'high'] } } }),
        () => fetch(`${d.platformUrl}/api/v1/billing/wallet`, { headers: { authorization: `Bearer ${key}` } }).then((r) => r.text()),
      ];
      const workers = Array.from({ length: 8 }, async (_, w) => {
        while (performance.now() < until) {
          await mix[(requests + w) % mix.length]!().catch(() => undefined);
          requests++;
        }
      });
      const samples: Array<[number, number]> = [];
      const t0 = performance.now();
      const sampler = (async () => {
        while (performance.now() < until) {
          samples.push([(performance.now() - t0) / 60_000, rssMiB(d.pid)]);
          // The main thread's V8 heap and external memory: what of the RSS is JavaScript's.
          const m = await (await fetch(`${d.platformUrl}/metrics`)).text();
          const mib = (name: string) => (Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(m)?.[1]) / 2 ** 20).toFixed(0);
          // The model workers' own V8 heaps and the buffers V8 knows they hold (tensors awaiting collection).
          const engine = await (await fetch(`${d.inferenceUrl}/metrics`)).text();
          const workers = (what: string) =>
            ([...engine.matchAll(new RegExp(`^cloudgate_engine_worker_${what}_bytes\\{[^}]*\\} (\\S+)$`, 'gm'))].reduce((a, x) => a + Number(x[1]), 0) / 2 ** 20).toFixed(0);
          console.log(
            `${samples.at(-1)![0].toFixed(1)} min  RSS ${samples.at(-1)![1].toFixed(0)} MiB  heap ${mib('nodejs_heap_size_used_bytes')} MiB  external ${mib('nodejs_external_memory_bytes')} MiB  workers: heap ${workers('heap_used')} MiB, buffers ${workers('external')} MiB  requests ${requests}`,
          );
          await sleep(10_000);
        }
      })();
      await Promise.all([...workers, sampler]);
      const half = samples.filter(([t]) => t >= minutes / 2);
      const slope = half.length > 1 ? (half.at(-1)![1] - half[0]![1]) / (half.at(-1)![0] - half[0]![0]) : NaN;
      console.log(`soak ${minutes} min, ${requests} requests: RSS ${samples[0]![1].toFixed(0)} -> ${samples.at(-1)![1].toFixed(0)} MiB, max ${Math.max(...samples.map((s) => s[1])).toFixed(0)} MiB; second half slope ${slope.toFixed(1)} MiB/min`);
    });
  },
};

const [what, arg] = process.argv.slice(2);
const run = what ? runs[what] : undefined;
if (!run) {
  console.error(`usage: node dist/bench/faults.js ${Object.keys(runs).join('|')} [arg]`);
  process.exit(2);
}
console.log(`# faults ${what} on ${machine()}`);
await run(arg);
