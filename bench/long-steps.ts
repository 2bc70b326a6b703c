import ort from 'onnxruntime-node';
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import { KvSlots, slotStepDone, slotStepFeeds } from '../src/inference/runtime/kv-slots.js';
import { prefillGraph } from '../src/inference/runtime/prefill-graph.js';
import { longStepGraph } from '../src/inference/runtime/long-steps.js';
import { withRewrittenGraphConfig } from '../src/inference/runtime/external-data.js';
import { weightTypeHere } from '../src/inference/runtime/integer-products.js';
import { spinSessionConfig } from '../src/inference/runtime/spin.js';
import { benchArgs, fmt, machine, median, wholeFlag, wholeListFlag } from './lib.js';

// The long-step session's graph (runtime/long-steps.ts: each layer's attention in causal pieces of
// the queries) against the prefill graph it is made from: one prompt step of --tokens tokens in one
// row, on an empty cache or after --after cached positions, each graph on every core with threads
// sleeping (as the daemon loads both), timed in turns in one process. The answers are checked
// against each other first.
// Usage: node dist/bench/long-steps.js --model DIR/model_q4.onnx [--tokens 1000,768,512] [--after 0] [--reps 7]

const args = benchArgs();
const file = args.get('model');
if (!file) throw new Error('--model: a slot-cache chat graph of block-quantized weights (a converted folder\'s model_q4.onnx or model_int8.onnx)');
const tokens = wholeListFlag(args, 'tokens', 1000, 1);
const after = wholeFlag(args, 'after', 0, 0);
const reps = wholeFlag(args, 'reps', 7, 1);
/** Logits the two graphs may differ by: float32's rounding in another order. */
const SAME_ANSWER_MAX = 1e-3;

async function main() {
  const prefill = prefillGraph(fs.readFileSync(file!), await weightTypeHere(), path.dirname(file!));
  if (!prefill) throw new Error(`${file} has no block-quantized products: no prefill graph, so no long-step graph`);
  const long = longStepGraph(prefill);
  if (!long) throw new Error(`${file}'s attention is not the converter's slot-cache form (or its queries are grouped): no long-step graph`);
  const opts: ort.InferenceSession.SessionOptions = { graphOptimizationLevel: 'all', intraOpNumThreads: os.availableParallelism(), interOpNumThreads: 1, enableMemPattern: false, extra: { session: spinSessionConfig('off') } };
  const sessions = { prefill: await ort.InferenceSession.create(prefill, withRewrittenGraphConfig(opts, file!)), long: await ort.InferenceSession.create(long, withRewrittenGraphConfig(opts, file!)) };
  const meta = sessions.prefill.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  const positionsMax = Math.max(...tokens) + after + 1;
  const sl = new KvSlots({ layers: meta.length, kvHeads: Number(meta[0]!.shape[1]), headDim: Number(meta[0]!.shape[3]), positionsMax, emptyCacheFeeds: true });
  let seq = 0;
  /** One prompt step of T tokens on `s` after `after` positions (cached by the prefill graph, untimed): its ms and logits. */
  const prompt = async (s: ort.InferenceSession, T: number) => {
    const id = seq++;
    const ids = (n: number, k: number) => Array.from({ length: n }, (_, j) => 5 + ((j * k) % 500));
    if (after) {
      const st = slotStepFeeds(sl, [{ seq: id, tokens: ids(after, 3) }]);
      slotStepDone(sl, st, await sessions.prefill.run(st.feeds));
    }
    const st = slotStepFeeds(sl, [{ seq: id, tokens: ids(T, 7) }]);
    const t0 = performance.now();
    const out = await s.run(st.feeds);
    const ms = performance.now() - t0;
    const logits = slotStepDone(sl, st, out);
    sl.delete(id);
    return { ms, logits };
  };
  console.log(`machine: ${machine()}\nmodel: ${file}; one row's prompt step after ${after} cached positions, ${os.availableParallelism()} threads sleeping between operators; ms, median of ${reps} runs in turns`);
  console.log('| tokens | prefill graph | long-step graph | long / prefill |\n| --- | --- | --- | --- |');
  for (const T of tokens) {
    const [want, got] = [(await prompt(sessions.prefill, T)).logits, (await prompt(sessions.long, T)).logits];
    let diff = 0;
    for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
    if (!(diff <= SAME_ANSWER_MAX)) throw new Error(`at ${T} tokens the long-step graph's logits differ from the prefill graph's by ${diff}`);
    const ms = { prefill: [] as number[], long: [] as number[] };
    for (let r = 0; r < reps; r++) for (const k of r % 2 ? (['long', 'prefill'] as const) : (['prefill', 'long'] as const)) ms[k].push((await prompt(sessions[k], T)).ms);
    const [p, l] = [median(ms.prefill), median(ms.long)];
    console.log(`| ${T} | ${fmt(p, 1)} | ${fmt(l, 1)} | ${fmt(l / p, 3)} |`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
