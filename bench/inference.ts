import fs from 'node:fs';
import path from 'node:path';
import ort from 'onnxruntime-node';
import { repoRoot, startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, benchKey, chatStream, fmt, machine, median } from './lib.js';
import { MODEL_DTYPES, modelFileOf, type ModelDtype } from '../src/inference/convert/model-config.js';
import { extraSessionsFor, pickVariant, threadsFor } from '../src/inference/runtime/engine.js';
import { SessionChoice, sessionsFor } from '../src/inference/runtime/session-choice.js';
import { spinningSessionConfig, spinSessionConfig } from '../src/inference/runtime/spin.js';
import { prefillGraph } from '../src/inference/runtime/prefill-graph.js';
import { weightTypeHere } from '../src/inference/runtime/integer-products.js';
import { loadConfig } from '../src/config.js';
import { KvSlots, slotStepDone, slotStepFeeds } from '../src/inference/runtime/kv-slots.js';
import { residentSessions, ResidentSlots } from '../src/inference/runtime/kv-resident.js';
import { withRewrittenGraphConfig } from '../src/inference/runtime/external-data.js';
import { providerEntry } from '../src/inference/runtime/execution-provider.js';

// Chat throughput through the daemon: N concurrent streams, aggregate
// completion tokens per second and time to first token, over SSE as a client
// sees them. Usage: node dist/bench/inference.js [--model ID] [--models-dir DIR] [--tokens 64] [--streams 1,4,16,64] [--seconds 8] [--raw-seconds 4] [--pairs K] [--json-schema story]
// [--dtype q4]: the weight variant (MODEL_DTYPE), where the model's folder holds it; else its cloudgate.json's.
// [--ttft first-token]: every request asks for logprobs, so each token comes in its own chunk even
// when its text is held back (an incomplete UTF-8 character), and TTFT is taken at the first token,
// as ../shared/peer's llama.cpp harness takes it; the default, first-text, is what a client reading
// only `content` sees.

const args = benchArgs();
const model = args.get('model') ?? 'cloudgate/stories260k';
const maxTokens = Number(args.get('tokens') ?? 64);
const streams = (args.get('streams') ?? '1,4,16,64').split(',').map(Number);
const seconds = Number(args.get('seconds') ?? 8);
const rawSeconds = Number(args.get('raw-seconds') ?? 4);
const pairs = Number(args.get('pairs') ?? 1);
const dtype = args.get('dtype') as ModelDtype | undefined;
if (dtype && !MODEL_DTYPES.includes(dtype)) throw new Error(`--dtype: one of ${MODEL_DTYPES.join(', ')}`);
// --json-schema story: every request asks for structured output (a one-string object, so the
// text runs to max_tokens as plain requests do), to measure what the grammar mask costs.
const STRUCTURED = { story: { type: 'json_schema', json_schema: { name: 'story', schema: { type: 'object', properties: { story: { type: 'string', maxLength: 1000 } }, required: ['story'], additionalProperties: false } } } };
const responseFormat = args.has('json-schema') ? STRUCTURED[args.get('json-schema') as keyof typeof STRUCTURED] : undefined;
if (args.has('json-schema') && !responseFormat) throw new Error(`--json-schema: one of ${Object.keys(STRUCTURED).join(', ')}`);

const ttftAt = args.get('ttft') ?? 'first-text';
if (ttftAt !== 'first-text' && ttftAt !== 'first-token') throw new Error('--ttft: first-text or first-token');
const firstToken = ttftAt === 'first-token';

const streamOpts = { model, maxTokens, firstToken, extra: responseFormat ? { response_format: responseFormat } : {} };
const oneStream = (url: string, key: string, prompt: string, onToken?: (atMs: number) => void) => chatStream(url, key, prompt, { ...streamOpts, onToken });

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))] ?? NaN;

/**
 * The baseline: the same ONNX file in a plain loop on this thread, batch B,
 * with the daemon's worker's threads (ORT_INTRA_OP_THREADS, every core by default; ORT_INTRA_OP_SPIN), doing the daemon's work:
 * passes of a `prompt`-token prefill then `steps` decode steps feeding
 * present into past, repeated for `seconds`. Answers tokens per second over
 * whole passes (the work the daemon's streams do) and over decode steps only.
 */
async function rawLoop(modelFile: string, dtype: ModelDtype, B: number, prompt: number, steps: number, seconds: number): Promise<{ withPrefill: number; decodeOnly: number }> {
  // The daemon's own reading of its settings (the same defaults, the same refusals).
  const cfg = loadConfig(process.env);
  const threads = cfg.ORT_INTRA_OP_THREADS ?? threadsFor(modelFile);
  const provider = cfg.EXECUTION_PROVIDER;
  const options = (intraOpNumThreads: number): ort.InferenceSession.SessionOptions => ({
    graphOptimizationLevel: 'all',
    intraOpNumThreads,
    interOpNumThreads: 1,
    extra: { session: spinSessionConfig(cfg.ORT_INTRA_OP_SPIN) },
    executionProviders: [providerEntry(provider, cfg.WEBGPU_VALIDATION_MODE)],
  });
  const sess = await ort.InferenceSession.create(modelFile, options(threads));
  // The daemon's worker's sessions (runtime/session-choice.ts), chosen the same way; the loop's B rows are its sequences.
  const allow = { narrow: cfg.ORT_NARROW_SESSION, spinning: cfg.ORT_SPINNING_SESSION, prefill: cfg.ORT_PREFILL_SESSION, spin: cfg.ORT_INTRA_OP_SPIN };
  // A GPU provider's model has no extra CPU sessions in the daemon (engine.ts), nor here; one worker has no peers to step beside on one thread.
  // Nor a long-step session: the loop's prompts are short (a row past 512 tokens is the only step that session runs).
  const loaded = provider === 'cpu' ? { ...extraSessionsFor(modelFile, threads, dtype, allow), prefillNarrow: false, long: false } : { narrow: false, spinning: false, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false };
  const narrow = loaded.narrow ? await ort.InferenceSession.create(modelFile, options(1)) : undefined;
  const spinning = loaded.spinning ? await ort.InferenceSession.create(modelFile, { ...options(threads), extra: { session: spinningSessionConfig('decode') } }) : undefined;
  // As the daemon's worker loads them (runtime/worker-sessions.ts): weights beside the graph found from its folder.
  const prefillBytes = loaded.prefill ? prefillGraph(fs.readFileSync(modelFile), await weightTypeHere(), path.dirname(modelFile)) : undefined;
  const prefill = prefillBytes ? await ort.InferenceSession.create(prefillBytes, withRewrittenGraphConfig(options(threads), modelFile)) : undefined;
  const prefillSpinning = prefillBytes && loaded.prefillSpinning ? await ort.InferenceSession.create(prefillBytes, withRewrittenGraphConfig({ ...options(threads), extra: { session: spinningSessionConfig('prompt') } }, modelFile)) : undefined;
  loaded.prefill = !!prefill;
  loaded.prefillSpinning = !!prefillSpinning;
  // The raw loop is one worker's: no replicas, so no one-thread prefill session.
  const sessions = { wide: sess, narrow, spinning, prefill, prefillSpinning, prefillNarrow: undefined, long: undefined };
  const choice = new SessionChoice();
  const runOn = async (feeds: Record<string, ort.Tensor>, tokens: number) =>
    (await choice.run(tokens, sessionsFor(tokens, B, loaded), (k) => sessions[k]!.run(feeds))).out;
  try {
    // On webgpu the daemon keeps a chat model's cache on the device (KV_ON_DEVICE): so does the loop, with the same graphs.
    if (sess.inputNames.includes('cache_bias') && provider === 'webgpu' && cfg.KV_ON_DEVICE) return await residentLoop(sess, modelFile, options(threads), B, prompt, steps, seconds);
    if (sess.inputNames.includes('cache_bias')) return await slotLoop(sess, runOn, B, prompt, steps, seconds, provider === 'cpu');
    return await pastLoop(sess, runOn, B, prompt, steps, seconds);
  } finally {
    await sess.release();
    await narrow?.release();
    await spinning?.release();
    await prefill?.release();
    await prefillSpinning?.release();
  }
}

type RunOn = (feeds: Record<string, ort.Tensor>, tokens: number) => Promise<ort.InferenceSession.OnnxValueMapType>;

/** rawLoop for a graph of the Hugging Face past_key_values layout (evaluation models, graphs exported elsewhere). */
async function pastLoop(sess: ort.InferenceSession, runOn: RunOn, B: number, prompt: number, steps: number, seconds: number): Promise<{ withPrefill: number; decodeOnly: number }> {
  const pk = sess.inputMetadata.filter((m) => /^past_key_values\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  const H = Number(pk[0]!.shape[1]);
  const D = Number(pk[0]!.shape[3]);
  const L = pk.length;
  let past: Record<string, ort.Tensor> = {};
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
  let tokens = 0;
  let total = 0;
  let decoding = 0;
  while (total < seconds * 1000) {
    const t0 = performance.now();
    past = {};
    for (let l = 0; l < L; l++) for (const w of ['key', 'value']) past[`past_key_values.${l}.${w}`] = new ort.Tensor('float32', new Float32Array(0), [B, H, 0, D]);
    advance(await runOn(feed(prompt, 0), B * prompt));
    const t1 = performance.now();
    for (let i = 0; i < steps; i++) {
      const out = await runOn(feed(1, prompt + i), B);
      // the daemon samples every row; the loop reads the logits too
      const lg = out.logits!.data as Float32Array;
      let best = 0;
      for (let j = 1; j < lg.length / B; j++) if (lg[j]! > lg[best]!) best = j;
      advance(out);
    }
    const t2 = performance.now();
    total += t2 - t0;
    decoding += t2 - t1;
    tokens += B * steps;
  }
  return { withPrefill: (tokens / total) * 1000, decodeOnly: (tokens / decoding) * 1000 };
}

/** rawLoop for a slot-cache graph (chat models): the worker's own cache (runtime/kv-slots.ts), with no scheduler, sampler or messages around it. */
/** The slot graph's cache layout, from its cache inputs. */
function slotLayoutOf(sess: ort.InferenceSession): { layers: number; kvHeads: number; headDim: number } {
  const meta = sess.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  return { layers: meta.length, kvHeads: Number(meta[0]!.shape[1]), headDim: Number(meta[0]!.shape[3]) };
}

async function slotLoop(sess: ort.InferenceSession, runOn: RunOn, B: number, prompt: number, steps: number, seconds: number, emptyCacheFeeds: boolean): Promise<{ withPrefill: number; decodeOnly: number }> {
  const sl = new KvSlots({ ...slotLayoutOf(sess), positionsMax: prompt + steps, emptyCacheFeeds });
  return stepLoop(
    B,
    prompt,
    steps,
    seconds,
    async (rows) => {
      const st = slotStepFeeds(sl, rows);
      return slotStepDone(sl, st, await runOn(st.feeds, rows.length * st.S));
    },
    (seq) => sl.delete(seq),
  );
}

/** rawLoop with the cache on the device (runtime/kv-resident.ts), as the daemon runs a chat model on webgpu. */
async function residentLoop(sess: ort.InferenceSession, modelFile: string, options: ort.InferenceSession.SessionOptions, B: number, prompt: number, steps: number, seconds: number): Promise<{ withPrefill: number; decodeOnly: number }> {
  const layout = slotLayoutOf(sess);
  const sessions = await residentSessions(modelFile, layout, options);
  if (!sessions) throw new Error(`${modelFile}: no single new_key_values output to keep on the device (convert it again)`);
  const { step, grow } = sessions;
  const kv = new ResidentSlots({ ...layout, positionsMax: prompt + steps }, sessions);
  try {
    return await stepLoop(B, prompt, steps, seconds, (rows) => kv.step(rows, (feeds) => step.run(feeds)), (seq) => kv.delete(seq));
  } finally {
    kv.dispose();
    await step.release();
    await grow.release();
  }
}

/** B sequences at once: a prompt step, `steps` decode steps with greedy picks, then the next B, for `seconds`. */
async function stepLoop(
  B: number,
  prompt: number,
  steps: number,
  seconds: number,
  stepRows: (rows: Array<{ seq: number; tokens: number[] }>) => Promise<Float32Array>,
  free: (seq: number) => void,
): Promise<{ withPrefill: number; decodeOnly: number }> {
  const seqs = Array.from({ length: B }, (_, i) => i);
  let tokens = 0;
  let total = 0;
  let decoding = 0;
  const run = async (n: number) => {
    const lg = await stepRows(seqs.map((seq) => ({ seq, tokens: new Array<number>(n).fill(5) })));
    let best = 0;
    for (let j = 1; j < lg.length / B; j++) if (lg[j]! > lg[best]!) best = j;
  };
  while (total < seconds * 1000) {
    const t0 = performance.now();
    await run(prompt);
    const t1 = performance.now();
    for (let i = 0; i < steps; i++) await run(1);
    const t2 = performance.now();
    for (const seq of seqs) free(seq);
    total += t2 - t0;
    decoding += t2 - t1;
    tokens += B * steps;
  }
  return { withPrefill: (tokens / total) * 1000, decodeOnly: (tokens / decoding) * 1000 };
}

async function main() {
  const modelsDir = path.resolve(args.get('models-dir') ?? path.join(repoRoot, 'models'));
  const env: Record<string, string> = { RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0', MODELS_DIR: modelsDir, ...(dtype ? { MODEL_DTYPE: dtype } : {}) };
  const d = await startDaemon(env);
  try {
    const key = await benchKey(d, ['inference:use'], 1_000_000_000);
    const url = `${d.inferenceUrl}/api/v1/chat/completions`;
    console.log(`machine: ${machine()}\nmodel: ${model}, ${maxTokens} tokens per stream, temperature 0${firstToken ? ", logprobs on, TTFT at the first token" : ""}`);
    await oneStream(url, key, 'warm up'); // warm-up
    const modelDir = fs.readdirSync(modelsDir).map((f) => path.join(modelsDir, f)).find((dir) => {
      const c = path.join(dir, 'cloudgate.json');
      return fs.existsSync(c) && JSON.parse(fs.readFileSync(c, 'utf8')).id === model;
    });
    if (!modelDir) throw new Error(`model ${model} not found in ${modelsDir}`);
    // the raw loop runs the very file the daemon serves
    const served = pickVariant(modelDir, JSON.parse(fs.readFileSync(path.join(modelDir, 'cloudgate.json'), 'utf8')).dtype ?? 'fp32', dtype);
    console.log(`weights: ${modelFileOf(served)}`);
    const stream1 = { rate: 0 };
    // Each of N clients sends its next request as soon as its last one ends, for
    // `seconds`: the steady state a load test sees, not the ragged start and
    // drain of one round of N requests.
    const rawFile = path.join(modelDir, modelFileOf(served));
    let promptTokens = 0;
    // A phase's rate counts its ragged start (every stream's first prompt at once) and its drain
    // (the last requests finishing after `until` in an ever smaller batch), which the raw loop, whose
    // rows always run together, does not have. With --ttft first-token each token's arrival is seen,
    // so the phase also gives its steady rate: tokens arriving from the end of the last stream's
    // first request to `until`, as a load test that keeps running would see them.
    const daemonPhase = async (n: number) => {
      const ttfts: number[] = [];
      const arrivals: number[] = [];
      let tokens = 0;
      let rampEnd = 0;
      const t0 = performance.now();
      const until = t0 + seconds * 1000;
      await Promise.all(
        Array.from({ length: n }, async (_, i) => {
          for (let r = 0; performance.now() < until; r++) {
            const o = await oneStream(url, key, `Once upon a time ${i}`, firstToken ? (at) => arrivals.push(at) : undefined);
            if (r === 0) rampEnd = Math.max(rampEnd, performance.now());
            tokens += o.tokens;
            promptTokens = o.promptTokens;
            ttfts.push(o.ttft);
          }
        }),
      );
      const inWindow = arrivals.filter((at) => at >= rampEnd && at < until).length;
      const steady = firstToken && until > rampEnd ? inWindow / ((until - rampEnd) / 1000) : NaN;
      return { rate: tokens / ((performance.now() - t0) / 1000), steady, ttfts };
    };
    for (const n of streams) {
      const { rate, steady, ttfts } = await daemonPhase(n);
      const raw = await rawLoop(rawFile, served, n, promptTokens, maxTokens, rawSeconds);
      if (n === 1) stream1.rate = rate;
      console.log(
        `streams ${String(n).padStart(2)}: daemon ${fmt(rate)} tokens/s (${ttfts.length} requests${firstToken ? `; ${fmt(steady)} in its steady window` : ''}) | raw loop batch ${n}: ${fmt(raw.withPrefill)} tokens/s ` +
          `(decode steps only ${fmt(raw.decodeOnly)}) | ratio ${fmt(rate / raw.withPrefill, 2)} (${fmt(rate / raw.decodeOnly, 2)})` +
          ` | vs 1 stream ${fmt(rate / stream1.rate, 1)}x | TTFT p50 ${fmt(pct(ttfts, 0.5), 1)} ms p99 ${fmt(pct(ttfts, 0.99), 1)} ms`,
      );
      // --pairs K: K - 1 more pairs of a daemon phase and a raw loop, the order alternating, and
      // the daemon / raw ratio of each: one pair shares the machine's minute, where one run of
      // each does not (bench/README.md "Long steps in float32").
      if (pairs > 1) {
        const ratios = [rate / raw.withPrefill];
        const steadyRatios = [steady / raw.withPrefill];
        for (let p = 1; p < pairs; p++) {
          const rawFirst = p % 2 === 1;
          const r1 = rawFirst ? await rawLoop(rawFile, served, n, promptTokens, maxTokens, rawSeconds) : undefined;
          const dm = await daemonPhase(n);
          const r2 = r1 ?? (await rawLoop(rawFile, served, n, promptTokens, maxTokens, rawSeconds));
          ratios.push(dm.rate / r2.withPrefill);
          steadyRatios.push(dm.steady / r2.withPrefill);
        }
        const line = (xs: number[]) => `${xs.map((r) => fmt(r, 2)).join(' ')} | median ${fmt(median(xs), 3)}`;
        console.log(`  daemon / raw loop (decode runs included) in ${pairs} pairs, order alternating: ${line(ratios)}`);
        if (firstToken) console.log(`  the same, the daemon's steady window only: ${line(steadyRatios)}`);
      }
    }
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
