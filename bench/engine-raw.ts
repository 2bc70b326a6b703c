// The engine's scheduler against a plain ONNX Runtime decode loop, in one
// process on one machine (no HTTP).
//
//   npm run build && node dist/bench/engine-raw.js <model folder | models dir> [--model id] [--steps 128] [--batches 1,4,16,64]
//
// For each batch size B:
//  (a) raw: one InferenceSession (same options as the engine's: 1 intra-op
//      thread, full graph optimisation) decoding B rows in a loop: prefill the
//      prompt once, then `steps` single-token steps feeding present -> past and
//      the argmax token back, on this thread;
//  (b) engine: B concurrent greedy `generate` streams of `steps` tokens each,
//      in process (worker thread, scheduler, sampling, detokenisation, stop
//      matching, async iterators); tokens/s from the first request to the last
//      token, prefill included.
// Then TTFT (generate() call to first delta) over sequential single streams.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import ort from 'onnxruntime-node';
import { Engine } from '../src/inference/engine/engine.js';
import { log } from '../src/log.js';

log.level = 'warn';

function args() {
  const a = process.argv.slice(2);
  const opt = (name: string) => {
    const i = a.indexOf(`--${name}`);
    if (i < 0) return undefined;
    const v = a[i + 1];
    a.splice(i, 2);
    return v;
  };
  const model = opt('model');
  const steps = Number(opt('steps') ?? 128);
  const batches = (opt('batches') ?? '1,4,16,64').split(',').map(Number);
  const ttftRuns = Number(opt('ttft-runs') ?? 100);
  const target = a[0];
  if (!target) {
    console.error('usage: node dist/bench/engine-raw.js <model folder | models dir> [--model id] [--steps 128] [--batches 1,4,16,64]');
    process.exit(2);
  }
  return { target: path.resolve(target), model, steps, batches, ttftRuns };
}

/** A models dir for the engine: the folder itself, or a temp dir linking to a single model folder. */
function modelsDirFor(target: string): { dir: string; cleanup: () => void } {
  if (!fs.existsSync(path.join(target, 'cloudgate.json'))) return { dir: target, cleanup: () => {} };
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'engine-raw-'));
  fs.symlinkSync(target, path.join(dir, path.basename(target)));
  return { dir, cleanup: () => fs.rmSync(dir, { recursive: true, force: true }) };
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

async function rawLoop(modelPath: string, prompt: number[], B: number, steps: number): Promise<number> {
  const session = await ort.InferenceSession.create(modelPath, {
    graphOptimizationLevel: 'all',
    intraOpNumThreads: 1,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  const meta = session.inputMetadata as ort.InferenceSession.TensorValueMetadata[];
  const keys = meta.filter((m) => /^past_key_values\.\d+\.key$/.test(m.name));
  const H = keys[0]!.shape[1] as number;
  const D = keys[0]!.shape[3] as number;
  const kvType = keys[0]!.type as 'float32' | 'float16';
  const hasPos = meta.some((m) => m.name === 'position_ids');
  const L = keys.length;
  const run = async (ids: BigInt64Array, S: number, P: number, past: Record<string, ort.Tensor>) => {
    const T = P + S;
    const pos = new BigInt64Array(B * S);
    for (let b = 0; b < B; b++) for (let j = 0; j < S; j++) pos[b * S + j] = BigInt(P + j);
    const feeds: Record<string, ort.Tensor> = {
      ...past,
      input_ids: new ort.Tensor('int64', ids, [B, S]),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(B * T).fill(1n), [B, T]),
    };
    if (hasPos) feeds.position_ids = new ort.Tensor('int64', pos, [B, S]);
    const out = await session.run(feeds);
    const next: Record<string, ort.Tensor> = {};
    for (let l = 0; l < L; l++) {
      next[`past_key_values.${l}.key`] = out[`present.${l}.key`]!;
      next[`past_key_values.${l}.value`] = out[`present.${l}.value`]!;
    }
    return { logits: out.logits!, past: next };
  };
  const argmaxLast = (logits: ort.Tensor, S: number) => {
    const V = logits.dims[2]!;
    const d = logits.data as Float32Array;
    const ids = new BigInt64Array(B);
    for (let b = 0; b < B; b++) {
      const o = (b * S + S - 1) * V;
      let best = 0;
      for (let i = 1; i < V; i++) if (d[o + i]! > d[o + best]!) best = i;
      ids[b] = BigInt(best);
    }
    return ids;
  };
  const empty: Record<string, ort.Tensor> = {};
  const zero = () => (kvType === 'float16' ? new Uint16Array(0) : new Float32Array(0));
  for (let l = 0; l < L; l++) {
    empty[`past_key_values.${l}.key`] = new ort.Tensor(kvType, zero(), [B, H, 0, D]);
    empty[`past_key_values.${l}.value`] = new ort.Tensor(kvType, zero(), [B, H, 0, D]);
  }
  const S0 = prompt.length;
  const ids0 = new BigInt64Array(B * S0);
  for (let b = 0; b < B; b++) for (let j = 0; j < S0; j++) ids0[b * S0 + j] = BigInt(prompt[j]!);
  // warm-up pass, then the measured one
  let best = 0;
  for (let rep = 0; rep < 2; rep++) {
    const t0 = performance.now();
    let { logits, past } = await run(ids0, S0, 0, empty);
    let ids = argmaxLast(logits, S0);
    for (let i = 0; i < steps - 1; i++) {
      ({ logits, past } = await run(ids, 1, S0 + i, past));
      ids = argmaxLast(logits, 1);
    }
    const dt = performance.now() - t0;
    best = Math.max(best, (B * steps) / (dt / 1000));
  }
  await session.release();
  return best;
}

async function engineRun(engine: Engine, model: string, prompt: number[], B: number, steps: number) {
  let best = { tps: 0, short: 0, stats: engine.stats(model, true) };
  for (let rep = 0; rep < 2; rep++) {
    engine.stats(model, true);
    const t0 = performance.now();
    let tokens = 0;
    let short = 0;
    await Promise.all(
      Array.from({ length: B }, async () => {
        for await (const ev of engine.generate(model, { promptTokens: prompt, maxTokens: steps, temperature: 0, topP: 1, stop: [] })) {
          if (ev.type === 'done') {
            tokens += ev.completionTokens;
            if (ev.completionTokens < steps) short++;
          }
        }
      }),
    );
    const dt = performance.now() - t0;
    const tps = tokens / (dt / 1000);
    const stats = engine.stats(model, true);
    if (tps > best.tps) best = { tps, short, stats };
  }
  return best;
}

async function main() {
  const a = args();
  const { dir, cleanup } = modelsDirFor(a.target);
  try {
    const engine = await Engine.load({ modelsDir: dir, executionProvider: 'cpu', intraOpThreads: 1 });
    const models = engine.list();
    const m = a.model ? models.find((x) => x.id === a.model) : (models.find((x) => x.kind === 'chat') ?? models[0]);
    if (!m) throw new Error(`no model in ${dir}${a.model ? ` with id ${a.model}` : ''}`);
    const folder = fs.readdirSync(dir).map((f) => path.join(dir, f)).find((f) => {
      try {
        return JSON.parse(fs.readFileSync(path.join(f, 'cloudgate.json'), 'utf8')).id === m.id;
      } catch {
        return false;
      }
    })!;
    const prompt = [...engine.bosTokens(m.id), ...engine.encode(m.id, 'Once upon a time')];
    const arch = engine.arch(m.id);
    console.log(`engine-raw: ${m.id} (${arch.layers} layers, ${arch.kvHeads} KV heads x ${arch.headDim}, ${arch.kvType} KV, vocab ${arch.vocab}), prompt ${prompt.length} tokens, ${a.steps} tokens per stream`);
    console.log(`machine: ${os.cpus().length} x ${os.cpus()[0]?.model ?? 'cpu'}, node ${process.version}`);
    console.log('');
    console.log('  B | raw tok/s | engine tok/s | engine/raw | engine step: run  prep+post  transport  main (ms) | modes');
    const rows: Array<{ B: number; raw: number; eng: number }> = [];
    for (const B of a.batches) {
      const raw = await rawLoop(path.join(folder, 'model.onnx'), prompt, B, a.steps);
      const e = await engineRun(engine, m.id, prompt, B, a.steps);
      const s = e.stats;
      const per = (x: number) => (x / Math.max(1, s.steps)).toFixed(3);
      rows.push({ B, raw, eng: e.tps });
      console.log(
        `${String(B).padStart(3)} | ${raw.toFixed(0).padStart(9)} | ${e.tps.toFixed(0).padStart(12)} | ${(e.tps / raw).toFixed(2).padStart(10)} |` +
          `              ${per(s.runMs)}  ${per(s.prepMs + s.postMs)}      ${per(s.transportMs)}      ${per(s.mainMs)}   | ${JSON.stringify(s.modes)}${e.short ? ` (${e.short} streams ended early at EOS)` : ''}`,
      );
    }
    const one = rows.find((r) => r.B === 1);
    const sixteen = rows.find((r) => r.B === 16);
    if (one && sixteen) console.log(`\n16 streams / 1 stream (engine): ${(sixteen.eng / one.eng).toFixed(2)}x`);

    // TTFT: a single stream on an idle engine, generate() to the first delta.
    const ttft: number[] = [];
    for (let i = 0; i < a.ttftRuns + 5; i++) {
      const t0 = performance.now();
      const it = engine.generate(m.id, { promptTokens: prompt, maxTokens: 4, temperature: 0, topP: 1, stop: [] });
      const first = await it.next();
      if (i >= 5) ttft.push(performance.now() - t0);
      if (first.done) break;
      await it.return(undefined);
      await new Promise((r) => setTimeout(r, 2));
    }
    console.log(`TTFT one stream (${ttft.length} runs, prompt ${prompt.length} tokens): p50 ${pct(ttft, 50).toFixed(2)} ms, p99 ${pct(ttft, 99).toFixed(2)} ms`);
    await engine.close();
  } finally {
    cleanup();
  }
}

await main();
