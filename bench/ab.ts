import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { repoRoot } from '../test/daemon.js';
import { benchKey, chatStream, fmt, machine } from './lib.js';

// Two daemon settings against each other on a machine whose speed drifts (this 2-core VM's
// one-stream rate moved 350-700 tokens/s from one minute to the next): both daemons run at
// once, and short phases of streaming alternate between them, so each pair of phases shares
// the machine's minute. Prints each pair's B / A ratio, how many pairs B won, their median
// and geometric mean.
// Usage: node dist/bench/ab.js --model ID --models-dir DIR [--a 'K=V,K=V'] [--b 'K=V'] [--a-root DIR] [--b-root DIR]
//   [--streams 1] [--rounds 20] [--seconds 2] [--tokens 64] [--ttft first-token]
// --a / --b: environment of each daemon; --a-root / --b-root: the checkout each runs (built), this one by default.

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i]!.replace(/^--/, ''), process.argv[i + 1]!);
const model = args.get('model') ?? 'cloudgate/stories260k';
const streams = Number(args.get('streams') ?? 1);
const rounds = Number(args.get('rounds') ?? 20);
const seconds = Number(args.get('seconds') ?? 2);
/** Streaming on a daemon before its phase is timed: its threads wake and its caches fill. */
const WARM_SECONDS = 0.3;
const opts = { model, maxTokens: Number(args.get('tokens') ?? 64), firstToken: args.get('ttft') === 'first-token' };

function envOf(spec: string | undefined): Record<string, string> {
  const env: Record<string, string> = {};
  for (const kv of (spec ?? '').split(',').filter(Boolean)) {
    const at = kv.indexOf('=');
    if (at <= 0) throw new Error(`--a / --b: KEY=VALUE pairs separated by commas, got '${kv}'`);
    env[kv.slice(0, at)] = kv.slice(at + 1);
  }
  return env;
}

type Daemons = typeof import('../test/daemon.js');

async function start(side: 'a' | 'b') {
  const root = path.resolve(args.get(`${side}-root`) ?? repoRoot);
  const lib: Daemons = await import(pathToFileURL(path.join(root, 'dist/test/daemon.js')).href);
  const env = { RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0', ...(args.has('models-dir') ? { MODELS_DIR: path.resolve(args.get('models-dir')!) } : {}), ...envOf(args.get(side)) };
  const d = await lib.startDaemon(env);
  const key = await benchKey(d, ['inference:use'], 1_000_000_000);
  return { d, key, stop: () => lib.stopDaemon(d), label: `${args.get(side) ?? '(defaults)'}${args.has(`${side}-root`) ? ` @ ${root}` : ''}` };
}

/** `streams` clients back to back for `secs`: completion tokens per second, TTFT p50. */
async function phase(url: string, key: string, secs: number): Promise<{ rate: number; ttftMs: number }> {
  let tokens = 0;
  const ttfts: number[] = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: streams }, async (_, i) => {
      for (let r = 0; performance.now() - t0 < secs * 1000; r++) {
        const o = await chatStream(url, key, `Once upon a time ${i}`, opts);
        tokens += o.tokens;
        ttfts.push(o.ttft);
      }
    }),
  );
  ttfts.sort((x, y) => x - y);
  return { rate: tokens / ((performance.now() - t0) / 1000), ttftMs: ttfts[ttfts.length >> 1] ?? NaN };
}

const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1]!;

async function main() {
  const a = await start('a');
  const b = await start('b');
  try {
    const url = (s: typeof a) => `${s.d.inferenceUrl}/v1/chat/completions`;
    console.log(`machine: ${machine()}\nmodel ${model}, ${streams} stream(s), ${rounds} pairs of ${seconds} s phases (order alternating)\nA: ${a.label}\nB: ${b.label}`);
    const res = { a: [] as Array<{ rate: number; ttftMs: number }>, b: [] as Array<{ rate: number; ttftMs: number }> };
    for (let r = 0; r < rounds; r++) {
      for (const side of r % 2 ? (['b', 'a'] as const) : (['a', 'b'] as const)) {
        const s = side === 'a' ? a : b;
        await phase(url(s), s.key, WARM_SECONDS);
        res[side].push(await phase(url(s), s.key, seconds));
      }
    }
    const ratios = res.b.map((x, i) => x.rate / res.a[i]!.rate);
    const geo = Math.exp(ratios.reduce((t, x) => t + Math.log(x), 0) / ratios.length);
    console.log(`A tokens/s: ${res.a.map((x) => fmt(x.rate)).join(' ')} (median ${fmt(median(res.a.map((x) => x.rate)))}), TTFT p50 median ${fmt(median(res.a.map((x) => x.ttftMs)), 1)} ms`);
    console.log(`B tokens/s: ${res.b.map((x) => fmt(x.rate)).join(' ')} (median ${fmt(median(res.b.map((x) => x.rate)))}), TTFT p50 median ${fmt(median(res.b.map((x) => x.ttftMs)), 1)} ms`);
    console.log(`B / A per pair: ${ratios.map((x) => fmt(x, 2)).join(' ')}\nB / A: median ${fmt(median(ratios), 3)}, geometric mean ${fmt(geo, 3)}, B faster in ${ratios.filter((x) => x > 1).length} of ${ratios.length} pairs`);
  } finally {
    await Promise.all([a.stop(), b.stop()]);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
