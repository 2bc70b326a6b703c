import fs from 'node:fs';
import os from 'node:os';
import ort from 'onnxruntime-node';
import { KvSlots, slotStepDone, slotStepFeeds } from '../src/inference/runtime/kv-slots.js';
import { prefillGraph } from '../src/inference/runtime/prefill-graph.js';
import { weightTypeHere } from '../src/inference/runtime/integer-products.js';
import { spinningSessionConfig, spinSessionConfig } from '../src/inference/runtime/spin.js';
import { benchArgs, fmt, machine } from './lib.js';

// The prefill session (runtime/prefill-graph.ts) against the graph as converted: one prompt
// step of --tokens tokens in --rows rows of an int8 or q4 chat graph, its MatMulNBits as
// converted and as int8 products (MatMulIntegerToFloat), each on every core with threads
// sleeping between operators and spinning while a run lasts, timed in turns in one process.
// Usage: node dist/bench/prefill-graph.js --model DIR/model_q4.onnx [--tokens 32,64,128,512] [--rows 1] [--reps 8]

const args = benchArgs();
const file = args.get('model');
if (!file) throw new Error("--model: a 4-bit slot-cache chat graph (a converted chat model folder's model_q4.onnx)");
const sizes = (args.get('tokens') ?? '32,64,128,512').split(',').map(Number);
const ROWS = Number(args.get('rows') ?? 1);
const REPS = Number(args.get('reps') ?? 8);

async function main() {
  const cores = os.availableParallelism();
  const converted = fs.readFileSync(file!);
  const int8 = prefillGraph(converted, await weightTypeHere());
  if (!int8) throw new Error(`${file} has no block-quantized products: nothing to compare`);
  const open = (graph: Uint8Array, spin: boolean) =>
    ort.InferenceSession.create(graph, { graphOptimizationLevel: 'all', intraOpNumThreads: cores, interOpNumThreads: 1, extra: { session: spin ? spinningSessionConfig('prompt') : spinSessionConfig('off') } });
  const sessions = { convertedSleeping: await open(converted, false), convertedSpinning: await open(converted, true), int8Sleeping: await open(int8, false), int8Spinning: await open(int8, true) };
  const kinds = Object.keys(sessions) as (keyof typeof sessions)[];
  const meta = sessions.convertedSleeping.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  if (!meta.length) throw new Error(`${file} is not a slot-cache chat graph`);
  console.log(`machine: ${machine()}\nmodel: ${file}, ${ROWS} row(s), ${cores} threads; median ms of ${REPS} prompt steps each (one more first, not counted), in turns`);
  console.log('| tokens a row | as converted, sleeping | as converted, spinning | int8 products, sleeping | int8 products, spinning | int8 products / as converted (best of each) |');
  console.log('| --- | --- | --- | --- | --- | --- |');
  for (const T of sizes) {
    const ms = Object.fromEntries(kinds.map((k) => [k, [] as number[]])) as Record<(typeof kinds)[number], number[]>;
    for (let rep = 0; rep <= REPS; rep++) {
      for (const k of kinds) {
        const sl = new KvSlots({ layers: meta.length, kvHeads: Number(meta[0]!.shape[1]), headDim: Number(meta[0]!.shape[3]), positionsMax: T + 1, emptyCacheFeeds: true });
        const st = slotStepFeeds(sl, Array.from({ length: ROWS }, (_, seq) => ({ seq, tokens: Array.from({ length: T }, (_, j) => 3 + ((j * 7 + seq) % 250)) })));
        const t0 = performance.now();
        slotStepDone(sl, st, await sessions[k].run(st.feeds));
        if (rep > 0) ms[k].push(performance.now() - t0);
      }
    }
    const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
    const m = kinds.map((k) => med(ms[k]));
    const ratio = Math.min(m[2]!, m[3]!) / Math.min(m[0]!, m[1]!);
    console.log(`| ${T} | ${m.map((x) => fmt(x, 2)).join(' | ')} | ${fmt(ratio, 3)} |`);
  }
  for (const k of kinds) await sessions[k].release();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
