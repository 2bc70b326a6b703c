import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { repoRoot, startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, benchKey, daemonProbe, envOf, machine, ownSummary, pairSummary, PHASE_SECONDS_MIN, secondsFlag, streamPhase, wholeFlag, type OwnView } from './lib.js';

// cloudgate against llama.cpp on the same weights, in alternating phases: ../shared/peer's
// compare.sh runs each engine once, one after the other, and on this VM the machine's speed
// can change between the two (one stream of m25 int4: 663 / 753 tokens/s in one run, 314 /
// 605 in another, the cloudgate half in a slow minute). Here the daemon stays up and short
// phases of the same workload (N clients, `Once upon a time <i>`, 64 greedy tokens, next
// request at once) alternate with ../shared/peer/llamacpp-bench.mjs runs (llama.cpp in
// process, one context with N sequences), so each pair shares its minute. Needs PEER_HOME
// as compare.sh sets it up (its node_modules, the GGUF it wrote).
// Usage: node dist/bench/peer-ab.js --model peer/m25 --models-dir DIR --gguf FILE.gguf [--threads 1] [--streams 1]
//   [--rounds 8] [--seconds 3] [--ttft first-token] [--kv f16] [--env 'K=V,K=V'] (the daemon's settings, e.g. MODEL_REPLICAS=2)
//   [--http]: llama.cpp behind the harness's node:http SSE server, driven by a client like ours, so both
//   sides pay for HTTP, a socket and a client on the same cores (in process it pays for none of them)
//   [--warm-seconds 5]: the daemon streams this long before the first pair
// Under the pairs, the daemon's own view of its phases (lib.ts daemonProbe): the engine's time to first
// token from admission, and the HTTP thread's CPU a token, so the client's figures split into the engine's part and the rest.

const args = benchArgs();
const gguf = args.get('gguf');
if (!gguf || !fs.existsSync(gguf)) throw new Error('--gguf: the GGUF of the same checkpoint (compare.sh writes it to $PEER_HOME/compare/<shape>/model[.type].gguf)');
const model = args.get('model') ?? 'peer/m25';
const streams = wholeFlag(args, 'streams', 1, 1);
const rounds = wholeFlag(args, 'rounds', 8, 1);
const seconds = secondsFlag(args, 'seconds', 3, PHASE_SECONDS_MIN);
const threads = wholeFlag(args, 'threads', 1, 1);
const firstToken = args.get('ttft') === 'first-token';
const harness = path.resolve(repoRoot, '../shared/peer/llamacpp-bench.mjs');
/** Streaming on the daemon before its phase is timed: its threads wake and its caches fill (llama.cpp's run warms up in its own process). */
const WARM_SECONDS = 0.3;
/**
 * Streaming before the first pair, so that the daemon's JavaScript runs compiled as in a daemon
 * that has served for a while: in its first seconds V8's compiler threads took ~6 % of a core
 * and the HTTP thread ~20 % more time a token (bench/README.md, "Both sides over HTTP").
 */
const FIRST_WARM_SECONDS_DEFAULT = 5;
const overHttp = args.has('http');
const firstWarmSeconds = secondsFlag(args, 'warm-seconds', FIRST_WARM_SECONDS_DEFAULT, 0);

interface Phase {
  rate: number;
  ttftMs: number;
}

function llamaPhase(): Promise<Phase> {
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'peer-ab-')), 'llama.json');
  const argv = [harness, '--model', gguf!, '--threads', String(threads), '--streams', String(streams), '--seconds', String(seconds), '--kv', args.get('kv') ?? 'f16', '--json', out, ...(overHttp ? ['--http'] : [])];
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, argv, { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, NODE_LLAMA_CPP_SKIP_DOWNLOAD: 'true' } });
    p.on('error', reject);
    p.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`llamacpp-bench exited with ${code}`));
      const r = JSON.parse(fs.readFileSync(out, 'utf8')).results[0];
      fs.rmSync(path.dirname(out), { recursive: true, force: true });
      resolve({ rate: r.rate, ttftMs: r.ttftP50 });
    });
  });
}

async function main() {
  const env: Record<string, string> = { RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0' };
  if (args.has('models-dir')) env.MODELS_DIR = path.resolve(args.get('models-dir')!);
  Object.assign(env, envOf(args.get('env')));
  const d = await startDaemon(env);
  try {
    const key = await benchKey(d, ['inference:use'], 1_000_000_000);
    const url = `${d.inferenceUrl}/v1/chat/completions`;
    console.log(`machine: ${machine()}\ncloudgate ${model} against llama.cpp ${path.basename(gguf!)} (${threads} thread(s)${overHttp ? ', behind node:http SSE' : ', in process'}), ${streams} stream(s)${args.has('env') ? `, daemon with ${args.get('env')}` : ''}, ${rounds} pairs of ${seconds} s phases (order alternating), TTFT at the first ${firstToken ? 'token' : 'text'} for cloudgate, the first token for llama.cpp`);
    const cg: Phase[] = [];
    const own: OwnView[] = [];
    const ll: Phase[] = [];
    const opts = { model, maxTokens: 64, firstToken };
    await streamPhase(url, key, streams, firstWarmSeconds, opts);
    for (let r = 0; r < rounds; r++) {
      for (const side of r % 2 ? (['llama', 'cg'] as const) : (['cg', 'llama'] as const)) {
        if (side === 'llama') ll.push(await llamaPhase());
        else {
          await streamPhase(url, key, streams, WARM_SECONDS, opts);
          const probed = await daemonProbe(d);
          const phase = await streamPhase(url, key, streams, seconds, opts);
          cg.push(phase);
          own.push(await probed(phase.tokens));
        }
      }
    }
    console.log(pairSummary({ label: 'llama.cpp', phases: ll }, { label: 'cloudgate', phases: cg }));
    console.log(ownSummary(own));
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
