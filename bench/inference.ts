import fs from 'node:fs';
import path from 'node:path';
import ort from 'onnxruntime-node';
import { repoRoot, startDaemon, stopDaemon } from '../test/daemon.js';
import { fmt, machine } from './lib.js';

// Chat throughput through the daemon: N concurrent streams, aggregate
// completion tokens per second and time to first token, over SSE as a client
// sees them. Usage: node dist/bench/inference.js [--model ID] [--models-dir DIR] [--tokens 64] [--streams 1,4,16,64]

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i]!.replace(/^--/, ''), process.argv[i + 1]!);
const model = args.get('model') ?? 'cloudgate/stories260k';
const maxTokens = Number(args.get('tokens') ?? 64);
const streams = (args.get('streams') ?? '1,4,16,64').split(',').map(Number);
const ROUNDS = Number(args.get('rounds') ?? 3);

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))] ?? NaN;

async function oneStream(url: string, key: string, prompt: string) {
  const t0 = performance.now();
  const res = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (!res.ok || !res.body) throw new Error(`stream answered ${res.status}: ${await res.text()}`);
  let ttft = NaN;
  let tokens = 0;
  let buf = '';
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk as Uint8Array, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (Number.isNaN(ttft) && j.choices?.[0]?.delta?.content) ttft = performance.now() - t0;
      if (j.usage) tokens = j.usage.completion_tokens;
    }
  }
  return { ttft, tokens };
}

/**
 * The baseline: the same ONNX file in a plain loop on this thread, batch B,
 * prefill of a short prompt then `steps` decode steps feeding present into
 * past, one intra-op thread like the daemon's worker. Tokens per second.
 */
async function rawLoop(modelFile: string, B: number, steps: number): Promise<number> {
  const sess = await ort.InferenceSession.create(modelFile, { graphOptimizationLevel: 'all', intraOpNumThreads: 1, interOpNumThreads: 1 });
  const pk = sess.inputMetadata.filter((m) => /^past_key_values\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  const H = Number(pk[0]!.shape[1]);
  const D = Number(pk[0]!.shape[3]);
  const L = pk.length;
  const prompt = 16;
  let past: Record<string, ort.Tensor> = {};
  for (let l = 0; l < L; l++) for (const w of ['key', 'value']) past[`past_key_values.${l}.${w}`] = new ort.Tensor('float32', new Float32Array(0), [B, H, 0, D]);
  const feed = (S: number, P: number) => {
    const ids = new BigInt64Array(B * S).fill(5n);
    const pos = new BigInt64Array(B * S).map((_, i) => BigInt(P + (i % S)));
    const mask = new BigInt64Array(B * (P + S)).fill(1n);
    return { input_ids: new ort.Tensor('int64', ids, [B, S]), position_ids: new ort.Tensor('int64', pos, [B, S]), attention_mask: new ort.Tensor('int64', mask, [B, P + S]), ...past };
  };
  const advance = (out: ort.InferenceSession.OnnxValueMapType) => {
    const next: Record<string, ort.Tensor> = {};
    for (let l = 0; l < L; l++) for (const w of ['key', 'value']) next[`past_key_values.${l}.${w}`] = out[`present.${l}.${w}`]!;
    past = next;
  };
  advance(await sess.run(feed(prompt, 0)));
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) {
    const out = await sess.run(feed(1, prompt + i));
    // the daemon samples on its main thread; the loop reads the logits too
    const lg = out.logits!.data as Float32Array;
    let best = 0;
    for (let j = 1; j < lg.length / B; j++) if (lg[j]! > lg[best]!) best = j;
    advance(out);
  }
  const secs = (performance.now() - t0) / 1000;
  await sess.release();
  return (B * steps) / secs;
}

async function main() {
  const modelsDir = path.resolve(args.get('models-dir') ?? path.join(repoRoot, 'models'));
  const env: Record<string, string> = { RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0', MODELS_DIR: modelsDir };
  const d = await startDaemon(env);
  try {
    const h = { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' };
    const post = (p: string, b: unknown) => fetch(d.platformUrl + p, { method: 'POST', headers: h, body: JSON.stringify(b) }).then((r) => r.json() as Promise<any>);
    const u = await post('/api/admin/users', { name: 'bench', email: `bench-${Date.now()}@bench.io` });
    const k = await post('/api/admin/api-keys', { userId: u.data.id, permissions: ['inference:use'], rateLimits: { requestsPerMinute: 1e9, tokensPerMinute: 1e9 } });
    await post('/api/admin/transactions/topup', { userId: u.data.id, amount: 1e9, type: 'TOPUP', description: 'bench' });
    const url = `${d.inferenceUrl}/api/v1/chat/completions`;
    console.log(`machine: ${machine()}\nmodel: ${model}, ${maxTokens} tokens per stream, temperature 0`);
    await oneStream(url, k.data.key, 'warm up'); // warm-up
    const modelDir = fs.readdirSync(modelsDir).map((f) => path.join(modelsDir, f)).find((dir) => {
      const c = path.join(dir, 'cloudgate.json');
      return fs.existsSync(c) && JSON.parse(fs.readFileSync(c, 'utf8')).id === model;
    });
    if (!modelDir) throw new Error(`model ${model} not found in ${modelsDir}`);
    const stream1 = { rate: 0 };
    for (const n of streams) {
      let best = 0;
      const ttfts: number[] = [];
      for (let r = 0; r < ROUNDS; r++) {
        const t0 = performance.now();
        const out = await Promise.all(Array.from({ length: n }, (_, i) => oneStream(url, k.data.key, `Once upon a time ${i}`)));
        const secs = (performance.now() - t0) / 1000;
        best = Math.max(best, out.reduce((s, o) => s + o.tokens, 0) / secs);
        ttfts.push(...out.map((o) => o.ttft));
      }
      const raw = await rawLoop(path.join(modelDir, 'model.onnx'), n, maxTokens);
      if (n === 1) stream1.rate = best;
      console.log(
        `streams ${String(n).padStart(2)}: daemon ${fmt(best)} tokens/s (best of ${ROUNDS}) | raw loop batch ${n}: ${fmt(raw)} tokens/s | ratio ${fmt(best / raw, 2)}` +
          ` | vs 1 stream ${fmt(best / stream1.rate, 1)}x | TTFT p50 ${fmt(pct(ttfts, 0.5), 1)} ms p99 ${fmt(pct(ttfts, 0.99), 1)} ms`,
      );
    }
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
