import fs from 'node:fs';
import { spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import autocannon, { type Options } from 'autocannon';
import { repoRoot, type Started } from '../test/daemon.js';

// Shared pieces of the HTTP benchmarks: a load run, a sweep for the highest
// rate under a p99 bound, a bare uWS server in its own process, machine facts,
// the streaming chat client.

export interface Load {
  connections: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  non2xx: number;
}

export async function load(url: string, headers: Record<string, string>, connections: number, seconds: number, extra: Partial<Options> = {}): Promise<Load> {
  const r = await autocannon({ url, headers, connections, duration: seconds, ...extra });
  return { connections, rps: r.requests.average, p50: r.latency.p50, p99: r.latency.p99, errors: r.errors + r.timeouts, non2xx: r.non2xx };
}

/** Highest req/s among the connection counts whose p99 stays at or under `p99MsMax`. */
export async function sweep(url: string, headers: Record<string, string>, seconds: number, p99MsMax: number, extra: Partial<Options> = {}) {
  const runs: Load[] = [];
  for (const c of [1, 2, 4, 8, 16, 32, 64]) {
    const r = await load(url, headers, c, seconds, extra);
    runs.push(r);
    if (r.p99 > p99MsMax * 3) break; // far past the bound: larger counts only queue more
  }
  // A run with failures or non-2xx answers measured something else (a 429 is cheaper than the route).
  const ok = runs.filter((r) => r.p99 <= p99MsMax && r.errors === 0 && r.non2xx === 0);
  const best = ok.reduce<Load | undefined>((a, b) => (!a || b.rps > a.rps ? b : a), undefined);
  return { runs, best };
}

/** Starts bench/bare-server.js answering `body` with `contentType` on an ephemeral port. */
export async function startBare(body: string, contentType: string): Promise<{ url: string; proc: ChildProcess }> {
  const proc = spawn(process.execPath, [new URL('./bare-server.js', import.meta.url).pathname], {
    env: { ...process.env, BARE_BODY: body, BARE_CONTENT_TYPE: contentType },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const port = await new Promise<number>((resolve, reject) => {
    proc.stdout!.once('data', (d) => resolve(Number(String(d).trim())));
    proc.once('exit', (c) => reject(new Error(`bare server exited ${c}`)));
  });
  return { url: `http://127.0.0.1:${port}`, proc };
}

export function machine(): string {
  const cpus = os.cpus();
  return `${cpus.length} x ${cpus[0]?.model ?? 'cpu'}${simd()}, ${Math.round(os.totalmem() / 2 ** 30)} GiB, node ${process.version}, ${os.platform()} ${os.release()}`;
}

/**
 * The CPU's family / model and its widest vector instructions: machines of one name ("AMD EPYC") have
 * come with and without AVX-512, and the int4 / int8 kernels of both engines change with it, so a
 * figure says which it was taken on.
 */
function simd(): string {
  let info = '';
  try {
    info = fs.readFileSync('/proc/cpuinfo', 'utf8').split('\n\n')[0] ?? '';
  } catch {
    return '';
  }
  const field = (k: string) => new RegExp(`^${k}\\s*:\\s*(.*)$`, 'm').exec(info)?.[1]?.trim();
  const flags = new Set((field('flags') ?? '').split(/\s+/));
  const isa = ['avx512_vnni', 'avx512f', 'avx_vnni', 'avx2'].filter((f) => flags.has(f));
  return ` (family ${field('cpu family') ?? '?'} model ${field('model') ?? '?'}, ${isa.join(' ') || 'no AVX2'})`;
}

export const fmt = (n: number, d = 0) => n.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });

/** Latencies at concurrency 1, in microseconds: their p50, p99 and rate, and every sample (sorted). */
export interface LatencyC1 {
  p50Us: number;
  p99Us: number;
  rps: number;
  samplesUs: Float64Array;
}

/**
 * One keep-alive socket to `url`: `once` sends a GET and resolves at its answer's end.
 * HTTP/1.1 written and read by hand on a bare socket: node:http's client took ~200 us of
 * CPU a request, and with the probe on the same 2-core machine as the server it measures,
 * the probe's own work was the largest thing that took the daemon's HTTP thread off its
 * core (bench/README.md "The HTTP thread's turns under load"). An answer must carry a
 * Content-Length, as both servers' do.
 */
async function probe(url: string, headers: Record<string, string>): Promise<{ once: () => Promise<void>; close: () => void }> {
  const u = new URL(url);
  const sock = net.connect({ host: u.hostname, port: Number(u.port), noDelay: true });
  await new Promise<void>((resolve, reject) => sock.once('connect', resolve).once('error', reject));
  const request = Buffer.from(
    [`GET ${u.pathname}${u.search} HTTP/1.1`, `Host: ${u.host}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`), '', ''].join('\r\n'),
  );
  let pending: { resolve: () => void; reject: (e: Error) => void } | undefined;
  let buf: Buffer = Buffer.alloc(0);
  const fail = (e: Error) => {
    const p = pending;
    pending = undefined;
    p?.reject(e);
  };
  sock.on('data', (chunk: Buffer) => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    const head = buf.indexOf('\r\n\r\n');
    if (head < 0 || !pending) return;
    const headText = buf.subarray(0, head).toString('latin1');
    const status = Number(headText.slice(9, 12));
    const length = /\r\ncontent-length: *(\d+)/i.exec(headText);
    if (!length) return fail(new Error(`${url} answered without a Content-Length during the latency run`));
    const end = head + 4 + Number(length[1]);
    if (buf.length < end) return;
    buf = buf.subarray(end);
    if (status !== 200) return fail(new Error(`${url} answered ${status} during the latency run`));
    const p = pending;
    pending = undefined;
    p.resolve();
  });
  sock.on('error', fail);
  sock.on('close', () => fail(new Error(`${url} closed the connection during the latency run`)));
  const once = () =>
    new Promise<void>((resolve, reject) => {
      pending = { resolve, reject };
      sock.write(request);
    });
  return { once, close: () => sock.destroy() };
}

const summary = (t: Float64Array, ms: number): LatencyC1 => {
  t.sort();
  return { p50Us: t[Math.floor(t.length * 0.5)]!, p99Us: t[Math.floor(t.length * 0.99)]!, rps: (t.length / ms) * 1000, samplesUs: t };
};

/**
 * Latency at concurrency 1 with microsecond resolution (autocannon rounds to
 * whole milliseconds): `count` sequential requests on one keep-alive socket.
 */
export async function latencyC1(url: string, headers: Record<string, string>, count: number): Promise<LatencyC1> {
  const p = await probe(url, headers);
  for (let i = 0; i < 200; i++) await p.once(); // warm-up
  const t = new Float64Array(count);
  const start = performance.now();
  for (let i = 0; i < count; i++) {
    const s = performance.now();
    await p.once();
    t[i] = (performance.now() - s) * 1000;
  }
  const total = performance.now() - start;
  p.close();
  return summary(t, total);
}

/**
 * Latency at concurrency 1 of two servers in the same moments: `count` pairs of sequential
 * requests, one to each (which goes first alternates), each on its own keep-alive socket. Under
 * a load whose pace drifts over seconds (a shared VM's neighbours, the model's steps), rounds
 * of one server then the other met different minutes of it; pairs meet the same ones.
 */
export async function latencyPairedC1(urls: [string, string], headers: Record<string, string>, count: number): Promise<[LatencyC1, LatencyC1]> {
  const ps = await Promise.all(urls.map((u) => probe(u, headers)));
  for (let i = 0; i < 200; i++) for (const p of ps) await p.once(); // warm-up
  const t = [new Float64Array(count), new Float64Array(count)];
  const start = performance.now();
  for (let i = 0; i < count; i++) {
    for (const k of i % 2 ? [1, 0] : [0, 1]) {
      const s = performance.now();
      await ps[k]!.once();
      t[k]![i] = (performance.now() - s) * 1000;
    }
  }
  const total = performance.now() - start;
  for (const p of ps) p.close();
  return [summary(t[0]!, total), summary(t[1]!, total)];
}

/**
 * A user of the started daemon with an API key holding `permissions`, funded
 * with `fundUnits` (USD x 10000) when given. Its rate limits are high enough
 * never to refuse: the limiter still runs on every request (its cost is part
 * of what is measured) but a 429 would be a cheaper answer than the route's.
 */
export async function benchKey(d: { platformUrl: string; adminKey: string }, permissions: string[], fundUnits = 0): Promise<string> {
  const h = { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' };
  const post = async (p: string, b: unknown) => {
    const r = await fetch(d.platformUrl + p, { method: 'POST', headers: h, body: JSON.stringify(b) });
    const body = (await r.json()) as any;
    if (!r.ok) throw new Error(`${p} answered ${r.status}: ${JSON.stringify(body)}`);
    return body;
  };
  const u = await post('/api/admin/users', { name: 'bench', email: `bench-${Date.now()}-${Math.random().toString(36).slice(2)}@bench.io` });
  const rateLimits = { requestsPerMinute: 1_000_000_000, tokensPerMinute: 1_000_000_000 };
  const k = await post('/api/admin/api-keys', { userId: u.data.id, permissions, rateLimits });
  if (fundUnits > 0) await post('/api/admin/transactions/topup', { userId: u.data.id, amount: fundUnits, type: 'TOPUP', description: 'bench' });
  return k.data.key as string;
}

// The chat client of the benchmarks: node:http with light parsing. On this 2-core machine
// the client shares the CPU with the daemon, and fetch's stream machinery cost enough per
// event to take a visible share of it from the engine.
// A `timeout` makes the Agent honour the daemon's `Keep-Alive: timeout=5` (it otherwise keeps idle
// sockets forever, and one reused as the daemon closed it, after a pause between phases, failed a run).
const chatAgent = new http.Agent({ keepAlive: true, maxSockets: 1024, timeout: 60_000 });

export interface ChatStreamOptions {
  model: string;
  maxTokens: number;
  /** TTFT at the first token (logprobs asked, so each token has its own chunk), else at the first text. */
  firstToken: boolean;
  /** More request fields (response_format, ...). */
  extra?: Record<string, unknown>;
  /** Called at each token's arrival; with firstToken only (without logprobs one chunk may carry several tokens). */
  onToken?: (atMs: number) => void;
  /** The conversation to send instead of one user message of `prompt`. */
  messages?: Array<{ role: 'system' | 'user' | 'assistant'; content: string }>;
  /** A system message before the user message of `prompt` (an app's fixed instructions). */
  system?: string;
  /** Called with each event's content text (the event's JSON parsed for it). */
  onContent?: (text: string) => void;
}

/** One streamed greedy chat completion: its time to first token (or text) and its token counts. */
export function chatStream(url: string, key: string, prompt: string, o: ChatStreamOptions): Promise<{ ttft: number; tokens: number; promptTokens: number }> {
  const t0 = performance.now();
  const user = { role: 'user', content: prompt };
  const body = JSON.stringify({ model: o.model, messages: o.messages ?? (o.system === undefined ? [user] : [{ role: 'system', content: o.system }, user]), max_tokens: o.maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true }, ...o.extra, ...(o.firstToken ? { logprobs: true } : {}) });
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent: chatAgent, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        if (res.statusCode !== 200) {
          // The daemon's answer names the field and the rule (an unknown model, a limit): say it.
          let answer = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (answer += c));
          res.on('end', () => reject(new Error(`stream answered ${res.statusCode}: ${answer}`)));
          return;
        }
        let ttft = NaN;
        let tokens = 0;
        let promptTokens = 0;
        let buf = '';
        res.setEncoding('utf8');
        res.on('data', (text: string) => {
          buf += text;
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const ev = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const seen = o.firstToken ? ev.includes('"logprobs":{"content":[{') : ev.includes('"content":"') && !ev.includes('"content":""');
            if (Number.isNaN(ttft) && seen) ttft = performance.now() - t0;
            if (seen && o.firstToken) o.onToken?.(performance.now());
            if (o.onContent && ev.startsWith('data: {')) {
              const content = JSON.parse(ev.slice(6)).choices?.[0]?.delta?.content;
              if (content) o.onContent(content);
            }
            if (ev.includes('"usage":{')) {
              const usage = JSON.parse(ev.slice(6)).usage;
              tokens = usage.completion_tokens;
              promptTokens = usage.prompt_tokens;
            }
          }
        });
        res.on('end', () => resolve({ ttft, tokens, promptTokens }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * One phase of streaming: `streams` clients back to back for `secs` (prompt `Once upon a time <i>`),
 * each sending its next request when the last ends; tokens/s and TTFT p50. With
 * `long`, `long.streams` clients more (default 1) send a long prompt (client i the i-th of `long.prompts`, in turn) and generate `long.maxTokens`
 * (long conversations beside short ones); their tokens count too, their time to first token does not.
 */
export async function streamPhase(url: string, key: string, streams: number, secs: number, o: ChatStreamOptions, long?: { prompts: string[]; maxTokens: number; streams?: number }): Promise<{ rate: number; ttftMs: number; tokens: number }> {
  let tokens = 0;
  const ttfts: number[] = [];
  const t0 = performance.now();
  const longOne = async (_: unknown, i: number) => {
    while (performance.now() - t0 < secs * 1000) {
      const r = await chatStream(url, key, long!.prompts[i % long!.prompts.length]!, { ...o, maxTokens: long!.maxTokens });
      tokens += r.tokens; // not `tokens += await ...`: that reads the sum before the await and drops the other streams' tokens
    }
  };
  await Promise.all(
    Array.from({ length: streams }, async (_, i) => {
      while (performance.now() - t0 < secs * 1000) {
        const r = await chatStream(url, key, `Once upon a time ${i}`, o);
        tokens += r.tokens;
        ttfts.push(r.ttft);
      }
    }).concat(Array.from({ length: long ? (long.streams ?? 1) : 0 }, longOne)),
  );
  ttfts.sort((a, b) => a - b);
  return { rate: tokens / ((performance.now() - t0) / 1000), ttftMs: ttfts[ttfts.length >> 1] ?? NaN, tokens };
}

/** A metric's `_sum` and `_count` over all its label sets, from Prometheus' text format. */
export function sumAndCount(text: string, name: string): { sum: number; count: number } {
  let sum = 0;
  let count = 0;
  for (const line of text.split('\n')) {
    const m = /^([^\s{]+)(?:\{[^}]*\})? (\S+)$/.exec(line);
    if (m?.[1] === `${name}_sum`) sum += Number(m[2]);
    else if (m?.[1] === `${name}_count`) count += Number(m[2]);
  }
  return { sum, count };
}

/** Linux's clock ticks a second, the unit of /proc/<pid>/task/<tid>/stat's CPU times. */
export const PROC_CLOCK_TICKS_PER_S = 100;

/** CPU time (user + system) of one of a process's threads so far, in ms, from /proc (Linux); NaN elsewhere. */
export function threadCpuMs(pid: number, tid: number): number {
  return statCpuMs(`/proc/${pid}/task/${tid}/stat`);
}

/** The CPU ms (user and system) a /proc stat file says, of a thread or of a whole process (`/proc/<pid>/stat`); NaN where it is not there. */
export function statCpuMs(file: string): number {
  try {
    const stat = fs.readFileSync(file, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // utime and stime: the 14th and 15th fields of stat, the 12th and 13th after the name
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / PROC_CLOCK_TICKS_PER_S;
  } catch {
    return NaN;
  }
}

/** What daemonProbe reads over a phase. */
export interface OwnView {
  engineTtftMs: number;
  httpThreadUsPerToken: number;
}

/**
 * The daemon's own view of a phase, to split what a client measures into the engine's part and
 * the daemon's around it: the engine's mean time to first token over the phase
 * (`vllm:time_to_first_token_seconds`, from admission to the engine to the first token: no HTTP,
 * no parsing, no tokenising; every request's, where ab.js's long prompts' are left out of the
 * client's p50), and its HTTP thread's CPU time a token. Call before the phase;
 * the answer's function reads the deltas after it.
 */
export async function daemonProbe(d: { pid: number; inferenceUrl: string }): Promise<(tokens: number) => Promise<OwnView>> {
  const ttft = async () => sumAndCount(await (await fetch(`${d.inferenceUrl}/metrics`)).text(), 'vllm:time_to_first_token_seconds');
  const before = await ttft();
  const cpu0 = threadCpuMs(d.pid, d.pid); // the main thread's id is the process's
  return async (tokens) => {
    const cpu1 = threadCpuMs(d.pid, d.pid);
    const after = await ttft();
    return { engineTtftMs: ((after.sum - before.sum) * 1000) / (after.count - before.count), httpThreadUsPerToken: ((cpu1 - cpu0) * 1000) / tokens };
  };
}

export const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

/** Each pair's B / A rate, their median and their geometric mean. */
export function pairRatios(a: ReadonlyArray<{ rate: number }>, b: ReadonlyArray<{ rate: number }>): { ratios: number[]; median: number; geo: number } {
  const ratios = b.map((x, i) => x.rate / a[i]!.rate);
  return { ratios, median: median(ratios), geo: Math.exp(ratios.reduce((t, x) => t + Math.log(x), 0) / ratios.length) };
}

/**
 * B's settings against A's with the side of the A/B benchmark cancelled: `straight` is B / A with
 * B's settings on the second daemon, `exchanged` the same B / A label's ratio with them on the
 * first. Their ratio's square root is B's settings over A's; their product's, what being the
 * second daemon itself is worth (the lean).
 */
export function sideCancelled(straight: number, exchanged: number): { settings: number; lean: number } {
  return { settings: Math.sqrt(straight / exchanged), lean: Math.sqrt(straight * exchanged) };
}

/** Alternated phases of two sides, as the A/B benchmarks print them: each side's rates, then each pair's ratio B / A. */
export function pairSummary(a: { label: string; phases: Array<{ rate: number; ttftMs: number }> }, b: { label: string; phases: Array<{ rate: number; ttftMs: number }> }): string {
  const side = (s: typeof a) =>
    `${s.label} tokens/s: ${s.phases.map((x) => fmt(x.rate)).join(' ')} (median ${fmt(median(s.phases.map((x) => x.rate)))}), TTFT p50 median ${fmt(median(s.phases.map((x) => x.ttftMs)), 1)} ms`;
  const { ratios, median: med, geo } = pairRatios(a.phases, b.phases);
  return [
    side(a),
    side(b),
    `${b.label} / ${a.label} per pair: ${ratios.map((x) => fmt(x, 2)).join(' ')}`,
    `median ${fmt(med, 3)}, geometric mean ${fmt(geo, 3)}, ${b.label} faster in ${ratios.filter((x) => x > 1).length} of ${ratios.length} pairs`,
  ].join('\n');
}

/** What daemonProbe read over a side's phases, as the A/B benchmarks print it under their pairs. */
export function ownSummary(phases: OwnView[], label = 'cloudgate'): string {
  // A phase where no first token came (none finished its prompt) or /proc is missing (not Linux) reads NaN: left out.
  const of = (xs: number[], digits: number, unit: string) => {
    const read = xs.filter(Number.isFinite);
    return read.length ? `${fmt(median(read), digits)} ${unit}` : 'not read';
  };
  return `${label}'s own view, medians of its phases: the engine's TTFT (from admission) ${of(phases.map((p) => p.engineTtftMs), 1, 'ms')}, its HTTP thread's CPU ${of(phases.map((p) => p.httpThreadUsPerToken), 0, 'us a token')}`;
}

/** The environment a `--a` / `--b` flag gives a daemon: KEY=VALUE pairs separated by commas. */
const STORY_WORDS = 'Once upon a time there was a little girl named Lily who loved to play in the park with her friends and her dog'.split(' ');
/** A text of `n` words from a children's story, over and over: the benchmarks' long prompts, system prompts and documents. */
export const storyText = (n: number): string => Array.from({ length: n }, (_, i) => STORY_WORDS[i % STORY_WORDS.length]).join(' ');

/** A chat benchmark's daemon settings: no rate limits, and `--models-dir` where given. */
export const chatBenchEnv = (args: Map<string, string>): Record<string, string> => ({ RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0', ...(args.has('models-dir') ? { MODELS_DIR: path.resolve(args.get('models-dir')!) } : {}) });

/** One side of an A/B benchmark: its daemon, a funded key, what it runs (its settings, its checkout). */
export interface Side {
  label: string;
  d: Started;
  key: string;
  stop: () => Promise<unknown>;
}

/**
 * Starts side `side` of an A/B benchmark: a daemon of the built checkout `--<side>-root` names (this
 * one by default) with `env` and then `--<side>`'s settings, and a key with funds for the whole run.
 */
export async function startSide(args: Map<string, string>, side: 'a' | 'b', env: Record<string, string> = {}): Promise<Side> {
  const root = path.resolve(args.get(`${side}-root`) ?? repoRoot);
  const lib: typeof import('../test/daemon.js') = await import(pathToFileURL(path.join(root, 'dist/test/daemon.js')).href);
  const d = await lib.startDaemon({ ...env, ...envOf(args.get(side)) });
  const key = await benchKey(d, ['inference:use'], 1_000_000_000);
  return { label: `${args.get(side) ?? '(defaults)'}${args.has(`${side}-root`) ? ` @ ${root}` : ''}`, d, key, stop: () => lib.stopDaemon(d) };
}

/**
 * An A/B benchmark's flags with A's and B's settings and checkouts exchanged: ab.js --both-sides
 * runs its second pairs so, B's settings on the first daemon and A's on the second.
 */
export function exchangeSides(from: Map<string, string>): Map<string, string> {
  const out = new Map(from);
  for (const [x, y] of [['a', 'b'], ['a-root', 'b-root']] as const) {
    for (const [k, v] of [[x, from.get(y)], [y, from.get(x)]] as const) {
      if (v === undefined) out.delete(k);
      else out.set(k, v);
    }
  }
  return out;
}

export function envOf(spec: string | undefined): Record<string, string> {
  const env: Record<string, string> = {};
  for (const kv of (spec ?? '').split(',').filter(Boolean)) {
    const at = kv.indexOf('=');
    if (at <= 0) throw new Error(`--a / --b / --env: KEY=VALUE pairs separated by commas, got '${kv}'`);
    env[kv.slice(0, at)] = kv.slice(at + 1);
  }
  return env;
}

/** A flag's whole number, at least `min`: a typo stops the run instead of quietly measuring something else (NaN rounds run none). */
export function wholeFlag(args: Map<string, string>, flag: string, fallback: number, min: number): number {
  const [v, ...more] = wholeListFlag(args, flag, fallback, min);
  if (more.length) throw new Error(`--${flag}: a whole number of at least ${min}, got '${args.get(flag)}'`);
  return v!;
}

/** A flag of comma-separated whole numbers, each at least `min`, checked as wholeFlag is. */
export function wholeListFlag(args: Map<string, string>, flag: string, fallback: number, min: number): number[] {
  const raw = args.get(flag);
  return (raw ?? String(fallback)).split(',').map((w) => {
    const v = Number(w);
    if (w.trim() === '' || !Number.isInteger(v) || v < min) throw new Error(`--${flag}: ${raw?.includes(',') ? 'whole numbers, comma-separated, each' : 'a whole number'} of at least ${min}, got '${raw}'`);
    return v;
  });
}

/** A timed phase shorter than this holds a few 64-token requests at one stream (~0.1 s each): too few to read a rate from. */
export const PHASE_SECONDS_MIN = 0.5;

/** A flag's seconds, at least `min` (fractions allowed), checked as wholeFlag is. */
export function secondsFlag(args: Map<string, string>, flag: string, fallback: number, min: number): number {
  const raw = args.get(flag);
  const v = raw === undefined ? fallback : Number(raw);
  if (!Number.isFinite(v) || v < min) throw new Error(`--${flag}: seconds, at least ${min}, got '${raw}'`);
  return v;
}

/** A bench's `--name value` pairs and bare `--flag`s (as 'true'), by name without the dashes. */
export function benchArgs(argv: string[] = process.argv.slice(2)): Map<string, string> {
  const args = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    const value = argv[i + 1];
    // a flag followed by another flag, or last, stands alone (`--http`, `--int8-products`)
    if (value === undefined || value.startsWith('--')) args.set(argv[i]!.replace(/^--/, ''), 'true');
    else args.set(argv[i++]!.replace(/^--/, ''), value);
  }
  return args;
}
