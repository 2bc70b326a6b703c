import ort from 'onnxruntime-node';
import fs from 'node:fs';
import os from 'node:os';
import { KvSlots, slotStepDone, slotStepFeeds } from '../src/inference/runtime/kv-slots.js';
import { oneTokenGraph } from '../src/inference/runtime/one-token-graph.js';
import { spinningSessionConfig } from '../src/inference/runtime/spin.js';
import { benchArgs, fmt, machine, median, wholeFlag, wholeListFlag } from './lib.js';

// A decode step of a slot-cache chat graph against the same step of its one-token graph
// (runtime/one-token-graph.ts, which the daemon's spinning session runs), the graphs alone: each
// pass is a 20-token prompt (on the slot graph, as the daemon runs a prompt elsewhere) and 64
// decode steps of one row on the graph timed, the graphs' passes in turns, on one thread and on
// every core spinning as the daemon's spinning session does. Only `session.run` is timed.
// Usage: node dist/bench/one-token-graph.js --model DIR/model_q4.onnx [--rounds 8] [--rows 1]
//   [--threads 1,2]

const args = benchArgs();
const file = args.get('model');
if (!file) throw new Error('--model: a slot-cache chat graph (model.onnx, model_q4.onnx, ...)');
const ROUNDS = wholeFlag(args, 'rounds', 8, 1);
const ROWS = wholeFlag(args, 'rows', 1, 1);
const THREADS = args.has('threads') ? wholeListFlag(args, 'threads', 1, 1) : [1, os.availableParallelism()];
const PROMPT_TOKENS = 20;
const DECODE_STEPS = 64;

const slotBytes = fs.readFileSync(file);
const oneToken = oneTokenGraph(slotBytes);
if (!oneToken) throw new Error(`${file}: no slot-cache attention to rewrite (not a slot-cache chat graph)`);

async function open(bytes: Uint8Array, threads: number): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(bytes, {
    graphOptimizationLevel: 'all',
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    ...(threads > 1 ? { extra: { session: spinningSessionConfig('decode') } } : {}),
  });
}

/** One pass: the prompt on `prompter`, then the decode steps on `s`; each step's `run` in ms, and its rows' greedy tokens. */
async function pass(prompter: ort.InferenceSession, s: ort.InferenceSession): Promise<{ ms: number[]; tokens: number[] }> {
  const meta = s.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  const sl = new KvSlots({ layers: meta.length, kvHeads: Number(meta[0]!.shape[1]), headDim: Number(meta[0]!.shape[3]), positionsMax: 1024, emptyCacheFeeds: true });
  const seqs = Array.from({ length: ROWS }, (_, i) => i);
  // Rows of different lengths, as a batch holds them.
  const prompt = slotStepFeeds(sl, seqs.map((seq) => ({ seq, tokens: Array.from({ length: PROMPT_TOKENS + 3 * seq }, (_, j) => 5 + j) })));
  let logits = slotStepDone(sl, prompt, await prompter.run(prompt.feeds));
  const ms: number[] = [];
  const tokens: number[] = [];
  const vocab = logits.length / ROWS;
  for (let i = 0; i < DECODE_STEPS; i++) {
    const next = seqs.map((b) => argmax(logits.subarray(b * vocab, (b + 1) * vocab)));
    tokens.push(...next);
    const st = slotStepFeeds(sl, seqs.map((seq, b) => ({ seq, tokens: [next[b]!] })));
    const t = performance.now();
    const out = await s.run(st.feeds);
    ms.push(performance.now() - t);
    logits = slotStepDone(sl, st, out);
  }
  return { ms, tokens };
}

function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
}

async function main() {
  console.log(`machine: ${machine()}\nmodel: ${file}, decode steps of ${ROWS} row(s) after a ${PROMPT_TOKENS}-token prompt; median ms of a step's run over ${ROUNDS} rounds of a pass each (${DECODE_STEPS} steps), the graphs in turns`);
  console.log('| threads | slot graph | one-token graph | one-token / slot | greedy tokens equal |');
  console.log('| --- | --- | --- | --- | --- |');
  const prompter = await open(slotBytes, 1);
  for (const threads of THREADS) {
    const sessions = [await open(slotBytes, threads), await open(oneToken!, threads)] as const;
    const times: [number[], number[]] = [[], []];
    let equal = 0;
    let compared = 0;
    for (let r = 0; r <= ROUNDS; r++) {
      // The first round warms both and is not counted; each round starts with the other graph.
      const order = r % 2 ? [1, 0] : [0, 1];
      const got: number[][] = [];
      for (const which of order) {
        const { ms, tokens } = await pass(prompter, sessions[which]!);
        got[which] = tokens;
        if (r > 0) times[which]!.push(...ms);
      }
      for (let i = 0; i < got[0]!.length; i++) equal += got[0]![i] === got[1]![i] ? 1 : 0;
      compared += got[0]!.length;
    }
    const [slot, one] = [median(times[0]), median(times[1])];
    console.log(`| ${threads} | ${fmt(slot, 3)} | ${fmt(one, 3)} | ${fmt(one / slot, 3)} | ${equal} of ${compared} |`);
    for (const s of sessions) await s.release();
  }
  await prompter.release();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
