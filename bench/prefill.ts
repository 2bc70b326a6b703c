import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { repoRoot, startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, benchKey, envOf, fmt, machine, median, wholeFlag } from './lib.js';

// Time to first token of one long prompt at one stream (issue 14.4): the
// daemon (the prompt as token ids through /v1/completions, max_tokens 1, so
// the time is the prefill's) against llama.cpp on the same weights (the GGUF
// that ../shared/peer/compare.sh wrote, run by the peer harness's
// node-llama-cpp in-process, one sequence, batch 512). Both get the same
// random token ids, a fresh prompt each run.
// Usage: node dist/bench/prefill.js --models-dir DIR --model ID --gguf FILE [--tokens 512] [--runs 7]
//   [--a K=V,... --b K=V,... [--a-root DIR --b-root DIR] [--skip 10]]: two daemons' settings (and
//   checkouts, built; this one by default) against each other instead (ab() below)
//   [--between N]: an untimed prompt of N tokens before each timed one, so that each long prompt
//   follows a short one, as in mixed traffic (the slot cache laid out for the short one first; the daemons only)
//   e.g. after compare.sh m25: --models-dir $PEER_HOME/compare/m25/models --model peer/m25 --gguf $PEER_HOME/compare/m25/model.q4_0.gguf

const args = benchArgs();
const modelsDir = path.resolve(args.get('models-dir') ?? '');
const model = args.get('model') ?? '';
const gguf = args.get('gguf') ?? '';
const tokens = Number(args.get('tokens') ?? 512);
const runs = Number(args.get('runs') ?? 7);
const between = wholeFlag(args, 'between', 0, 0);

function prompts(vocab: number): number[][] {
  let s = 7;
  const next = () => ((s = (s * 1103515245 + 12345) % 2 ** 31), s);
  // Ids from 3 up: no BOS / EOS / pad in the middle of the prompt.
  return Array.from({ length: runs + 1 }, () => Array.from({ length: tokens }, () => 3 + (next() % (vocab - 3))));
}

/** A daemon (with `env` over the defaults; of the built checkout `root`, this one by default) answering one prompt's time to first token at a time. */
async function cloudgateDaemon(env: Record<string, string>, root?: string): Promise<{ ttft: (prompt: number[]) => Promise<number>; stop: () => Promise<void> }> {
  const lib: typeof import('../test/daemon.js') = root ? await import(pathToFileURL(path.join(path.resolve(root), 'dist/test/daemon.js')).href) : { startDaemon, stopDaemon };
  const d = await lib.startDaemon({ MODELS_DIR: modelsDir, RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0', ...env });
  const key = await benchKey(d, ['inference:use'], 1_000_000_000);
  const ttft = async (prompt: number[]) => {
    // Its tail reversed: no opening of the timed prompt, which would start from the short one's kept cache.
    if (between) await first(prompt.slice(-between).reverse());
    return first(prompt);
  };
  const first = async (prompt: number[]) => {
    const t0 = performance.now();
    const r = await fetch(`${d.inferenceUrl}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model, prompt, max_tokens: 1, temperature: 0, stream: true }),
    });
    const reader = r.body!.getReader();
    const first = await reader.read();
    const ms = performance.now() - t0;
    if (r.status !== 200 || first.done) throw new Error(`completions answered ${r.status}`);
    while (!(await reader.read()).done);
    return ms;
  };
  return { ttft, stop: async () => void (await lib.stopDaemon(d)) };
}

async function cloudgate(ps: number[][]): Promise<number[]> {
  const d = await cloudgateDaemon({});
  try {
    const out: number[] = [];
    for (const prompt of ps) out.push(await d.ttft(prompt));
    return out.slice(1); // the first run warms the session's shapes
  } finally {
    await d.stop();
  }
}

/**
 * --a K=V[,K=V] --b K=V[,K=V]: two daemons up at once, each prompt sent to both in turn (the
 * order alternating), so that each pair shares the machine's minute; the first --skip pairs
 * (the sessions' first runs and measuring) are not counted.
 */
async function ab(ps: number[][]): Promise<void> {
  const skip = Number(args.get('skip') ?? 10);
  const a = await cloudgateDaemon(envOf(args.get('a')), args.get('a-root'));
  const b = await cloudgateDaemon(envOf(args.get('b')), args.get('b-root'));
  try {
    const A: number[] = [];
    const B: number[] = [];
    for (let i = 0; i < ps.length; i++) {
      let x: number;
      let y: number;
      if (i % 2) (y = await b.ttft(ps[i]!)), (x = await a.ttft(ps[i]!));
      else (x = await a.ttft(ps[i]!)), (y = await b.ttft(ps[i]!));
      if (i >= skip) A.push(x), B.push(y);
    }
    const ratios = B.map((y, i) => y / A[i]!);
    console.log(`machine: ${machine()}`);
    console.log(`${model}, a ${tokens}-token prompt at 1 stream${between ? ` (each after an untimed ${between}-token one)` : ''}, time to first token (ms), ${A.length} pairs after ${skip} not counted, order alternating`);
    const label = (side: 'a' | 'b') => `${args.get(side) ?? 'defaults'}${args.has(`${side}-root`) ? ` @ ${args.get(`${side}-root`)}` : ''}`;
    console.log(`A (${label('a')}): median ${fmt(median(A), 1)} | B (${label('b')}): median ${fmt(median(B), 1)}`);
    console.log(`A: ${A.map((x) => fmt(x, 0)).join(' ')}\nB: ${B.map((x) => fmt(x, 0)).join(' ')}`);
    console.log(`B / A per pair: ${ratios.map((r) => fmt(r, 2)).join(' ')}\nmedian ${fmt(median(ratios), 3)}, B faster in ${ratios.filter((r) => r < 1).length} of ${ratios.length} pairs`);
  } finally {
    await a.stop();
    await b.stop();
  }
}

async function llamacpp(ps: number[][], threads: number): Promise<number[]> {
  const peer = (await import(pathToFileURL(path.join(repoRoot, '../shared/peer/lib.mjs')).href)) as {
    loadLlama: (o: { maxThreads?: number }) => Promise<{ loadModel: (o: object) => Promise<LlamaModel> }>;
  };
  interface LlamaModel {
    createContext(o: object): Promise<{ getSequence(): LlamaSeq; dispose(): Promise<void> }>;
    dispose(): Promise<void>;
  }
  interface LlamaSeq {
    evaluate(ids: number[], o: object): AsyncIterable<number>;
    clearHistory(): Promise<void>;
  }
  const llama = await peer.loadLlama({ maxThreads: threads });
  const m = await llama.loadModel({ modelPath: gguf, useMmap: true });
  const ctx = await m.createContext({ sequences: 1, contextSize: tokens + 64, batchSize: 512, threads });
  const seq = ctx.getSequence();
  const out: number[] = [];
  for (const prompt of ps) {
    await seq.clearHistory();
    const t0 = performance.now();
    for await (const _ of seq.evaluate(prompt, { temperature: 0 })) break;
    out.push(performance.now() - t0);
  }
  await ctx.dispose();
  await m.dispose();
  return out.slice(1);
}

async function main() {
  if (!model || !gguf || !fs.existsSync(gguf)) throw new Error('usage: prefill.js --models-dir DIR --model ID --gguf FILE [--tokens 512] [--runs 7]');
  const vocab = (JSON.parse(fs.readFileSync(path.join(modelsDir, model.split('/').pop()!, 'config.json'), 'utf8')) as { vocab_size: number }).vocab_size;
  const ps = prompts(vocab);
  if (['a', 'b', 'a-root', 'b-root'].some((f) => args.has(f))) return ab(ps);
  const cg = await cloudgate(ps);
  const l1 = await llamacpp(ps, 1);
  const l2 = await llamacpp(ps, 2);
  console.log(`machine: ${machine()}`);
  console.log(`${model}, a ${tokens}-token prompt at 1 stream, time to first token, median of ${runs} (ms):`);
  console.log(`cloudgate daemon ${fmt(median(cg), 1)} (${cg.map((x) => fmt(x, 0)).join(', ')}) | llama.cpp 1 thread ${fmt(median(l1), 1)} | 2 threads ${fmt(median(l2), 1)} | ratio cg / best llama.cpp ${fmt(median(cg) / Math.min(median(l1), median(l2)), 2)}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
