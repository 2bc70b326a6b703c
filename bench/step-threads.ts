import ort from 'onnxruntime-node';
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import { KvSlots, slotStepDone, slotStepFeeds } from '../src/inference/runtime/kv-slots.js';
import { prefillGraph } from '../src/inference/runtime/prefill-graph.js';
import { withRewrittenGraphConfig } from '../src/inference/runtime/external-data.js';
import { weightTypeHere } from '../src/inference/runtime/integer-products.js';
import { spinningSessionConfig, spinSessionConfig, type ThreadSpin } from '../src/inference/runtime/spin.js';
import { benchArgs, fmt, machine, median } from './lib.js';

// Where one thread beats every core (runtime/session-choice.ts): a chat graph's
// decode step at several batch sizes, and a 20-token prompt, on a session of one
// intra-op thread, one of every core with threads sleeping when idle, and one of
// every core with threads spinning while a run lasts and 1 ms after (spin.ts `decode`), each batch
// size timed in turns on the three in one process.
// Usage: node dist/bench/step-threads.js --model DIR/model_q4.onnx [--batches 1,2,4,8,16] [--reps 8]
// [--int8-products]: the graph as the prefill session runs it (runtime/prefill-graph.ts)
// [--steps 64]: decode steps a pass; the slot cache's capacity (positions every row's attention
// reads, filled or not) grows with them, and the table says which it reached; with --by-capacity yes
// each capacity's decode steps are also shown apart (the step's cost of reading it)

const args = benchArgs();
const file = args.get('model');
if (!file) throw new Error('--model: a slot-cache chat graph (a converted chat model folder\'s model*.onnx)');
const batches = (args.get('batches') ?? '1,2,4,8,16').split(',').map(Number);
const REPS = Number(args.get('reps') ?? 8);
const PROMPT_TOKENS = 20;
const DECODE_STEPS = Number(args.get('steps') ?? 64);
if (!Number.isInteger(DECODE_STEPS) || DECODE_STEPS < 1) throw new Error(`--steps: a whole number of decode steps, at least 1 (got ${args.get('steps')})`);

const graph = args.has('int8-products') ? prefillGraph(fs.readFileSync(file), await weightTypeHere(), path.dirname(file)) : undefined;
if (args.has('int8-products') && !graph) throw new Error(`${file} has no block-quantized products to rewrite`);

async function open(threads: number, spin: ThreadSpin): Promise<ort.InferenceSession> {
  const opts: ort.InferenceSession.SessionOptions = {
    graphOptimizationLevel: 'all',
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    // the spinning session as the daemon loads it
    extra: { session: spin === 'run' ? spinningSessionConfig('decode') : spinSessionConfig(spin) },
  };
  return graph ? ort.InferenceSession.create(graph, withRewrittenGraphConfig(opts, file!)) : ort.InferenceSession.create(file!, opts);
}

/** One pass: a 20-token prompt for each of B rows, then DECODE_STEPS decode steps; answers the prompt step's ms and each decode step's, with the slot capacity it read (a step that grows it reads the grown one). */
async function pass(s: ort.InferenceSession, B: number): Promise<{ promptMs: number; steps: Array<{ ms: number; capacity: number }> }> {
  const meta = s.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  if (!meta.length) throw new Error(`${file} is not a slot-cache chat graph`);
  // The model's context as the daemon's slots take it, so the capacity grows as it would there.
  const sl = new KvSlots({ layers: meta.length, kvHeads: Number(meta[0]!.shape[1]), headDim: Number(meta[0]!.shape[3]), positionsMax: Math.max(1024, PROMPT_TOKENS + DECODE_STEPS + 1), emptyCacheFeeds: true });
  const seqs = Array.from({ length: B }, (_, i) => i);
  const run = async (n: number) => {
    const st = slotStepFeeds(sl, seqs.map((seq) => ({ seq, tokens: Array.from({ length: n }, (_, j) => 5 + j) })));
    slotStepDone(sl, st, await s.run(st.feeds));
  };
  let t = performance.now();
  await run(PROMPT_TOKENS);
  const promptMs = performance.now() - t;
  const steps: Array<{ ms: number; capacity: number }> = [];
  for (let i = 0; i < DECODE_STEPS; i++) {
    t = performance.now();
    await run(1);
    steps.push({ ms: performance.now() - t, capacity: sl.cap });
  }
  return { promptMs, steps };
}

async function main() {
  const cores = os.availableParallelism();
  const sessions = { one: await open(1, 'off'), sleeping: await open(cores, 'off'), spinning: await open(cores, 'run') };
  const kinds = Object.keys(sessions) as (keyof typeof sessions)[];
  console.log(`machine: ${machine()}\nmodel: ${file}${graph ? ', its products as int8 ones (the prefill session)' : ''}\nmedian ms: one ${PROMPT_TOKENS}-token prompt per row, and a decode step, over ${REPS} passes of ${DECODE_STEPS} steps (the first pass of each not counted); ${cores} threads sleeping between operators, or spinning while a run lasts and 1 ms after (the daemon's decode session)`);
  console.log(`| batch | prompt step: 1 thread / ${cores} sleeping / ${cores} spinning | decode step: 1 thread / ${cores} sleeping / ${cores} spinning | fastest decode | slot capacity |`);
  console.log('| --- | --- | --- | --- | --- |');
  for (const B of batches) {
    const r = Object.fromEntries(kinds.map((k) => [k, { p: [] as number[], s: [] as Array<{ ms: number; capacity: number }> }])) as Record<(typeof kinds)[number], { p: number[]; s: Array<{ ms: number; capacity: number }> }>;
    for (let rep = 0; rep <= REPS; rep++) {
      for (const k of kinds) {
        const { promptMs, steps } = await pass(sessions[k], B);
        if (rep === 0) continue;
        r[k].p.push(promptMs);
        r[k].s.push(...steps);
      }
    }
    const msOf = (k: (typeof kinds)[number], capacity?: number) => r[k].s.filter((x) => capacity === undefined || x.capacity === capacity).map((x) => x.ms);
    const step = kinds.map((k) => median(msOf(k)));
    const capacities = [...new Set(r[kinds[0]!].s.map((x) => x.capacity))];
    const best = step.indexOf(Math.min(...step));
    const next = Math.min(...step.filter((_, i) => i !== best));
    console.log(`| ${B} | ${kinds.map((k) => fmt(median(r[k].p), 2)).join(' / ')} | ${step.map((x) => fmt(x, 3)).join(' / ')} | ${kinds[best]} (${fmt(next / step[best]!, 2)}x the next) | ${capacities.at(-1)} |`);
    if (args.has('by-capacity')) for (const c of capacities) console.log(`|   capacity ${c} | | ${kinds.map((k) => fmt(median(msOf(k, c)), 3)).join(' / ')} (${msOf(kinds[0]!, c).length} steps) | | |`);
  }
  for (const k of kinds) await sessions[k].release();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
