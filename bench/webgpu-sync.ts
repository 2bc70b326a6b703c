import fs from 'node:fs';
import ort from 'onnxruntime-node';
import { ResidentSlots, residentSessions, type ResidentSessions } from '../src/inference/runtime/kv-resident.js';
import { residentGraph } from '../src/inference/runtime/resident-graph.js';
import { withRewrittenGraphConfig } from '../src/inference/runtime/external-data.js';
import { benchArgs, fmt, machine, median } from './lib.js';
import { slotGraphLayout } from './slot-graph.js';

// Where a decode step of the device-cache graph spends its time on webgpu (one stream on an H200
// took 8.4 ms a step at m25 whatever its rows; llama.cpp's CUDA build 0.6 ms a token). Three
// figures a step, each the median of its rounds:
// - `as served`: the graph as the daemon runs it, its logits read back to the host (kv-resident.ts);
// - `logits left on the device`: the same graph with its logits also a 'gpu-buffer' output, so a
//   run reads nothing back: what the host spends issuing the step (onnxruntime, Dawn), if run()
//   does not wait for the device when it has nothing to read;
// - `one Add, read back`: a graph of one Add on a [rows, vocab] tensor, its output read back: the
//   floor of any step that returns to the host.
// Usage: node dist/bench/webgpu-sync.js --model DIR/model_q4.onnx [--rows 1,16] [--steps 40] [--rounds 5]

const args = benchArgs();
const file = args.get('model');
if (!file) throw new Error('--model: a converted chat model\'s slot-cache graph (model*.onnx)');
const ROWS = (args.get('rows') ?? '1,16').split(',').map(Number);
const STEPS = Number(args.get('steps') ?? 40);
const ROUNDS = Number(args.get('rounds') ?? 5);
const PROMPT_TOKENS = 20;
const webgpu: ort.InferenceSession.SessionOptions = { executionProviders: ['webgpu'] };

const layout = await slotGraphLayout(file);
const served = await residentSessions(file, layout, webgpu);
if (!served) throw new Error(`${file} has no single new_key_values output: convert it again`);
const unread: ResidentSessions = {
  step: await ort.InferenceSession.create(residentGraph(fs.readFileSync(file), layout)!, withRewrittenGraphConfig({ ...webgpu, preferredOutputLocation: { logits: 'gpu-buffer', kv_cache_out: 'gpu-buffer' } as const }, file)),
  grow: served.grow,
};

/** Decode steps of `rows` sequences on `s`: each step's ms. Logits left on the device are given back unread. */
async function round(s: ResidentSessions, rows: number): Promise<number[]> {
  const kv = new ResidentSlots(layout, s);
  const placeholder = { logits: new ort.Tensor('float32', new Float32Array(1), [1, 1]) };
  const run = async (feeds: Record<string, ort.Tensor>) => {
    const out = await s.step.run(feeds);
    if (out.logits!.location !== 'gpu-buffer') return out;
    out.logits!.dispose();
    return { ...out, ...placeholder };
  };
  const seqs = Array.from({ length: rows }, (_, i) => i);
  try {
    await kv.step(seqs.map((seq) => ({ seq, tokens: Array.from({ length: PROMPT_TOKENS }, (_, j) => 5 + ((seq + j) % 200)) })), run);
    const ms: number[] = [];
    for (let i = 0; i < STEPS; i++) {
      const t = performance.now();
      await kv.step(seqs.map((seq) => ({ seq, tokens: [5 + ((seq + i) % 200)] })), run);
      ms.push(performance.now() - t);
    }
    return ms;
  } finally {
    kv.dispose();
  }
}

/** A graph of one Add: y = x + x, float32 [rows, vocab] (ONNX protobuf written by hand: 5 small messages). */
async function oneAdd(): Promise<ort.InferenceSession> {
  const enc = new TextEncoder();
  const varint = (n: number) => {
    const b: number[] = [];
    for (; n > 127; n >>>= 7) b.push((n & 127) | 128);
    b.push(n);
    return b;
  };
  const field = (no: number, bytes: number[] | Uint8Array) => [(no << 3) | 2, ...varint(bytes.length), ...bytes];
  const str = (no: number, s: string) => field(no, enc.encode(s));
  const num = (no: number, n: number) => [(no << 3) | 0, ...varint(n)];
  // TypeProto.Tensor float [rows, vocab] with symbolic dims.
  const dim = (name: string) => field(1, str(2, name));
  const type = field(1, [...num(1, 1), ...field(2, [...dim('rows'), ...dim('vocab')])]);
  const value = (name: string) => [...str(1, name), ...field(2, type)];
  const node = [...str(1, 'x'), ...str(1, 'x'), ...str(2, 'y'), ...str(4, 'Add')];
  const graph = [...field(1, node), ...str(2, 'one_add'), ...field(11, value('x')), ...field(12, value('y'))];
  const model = [...num(1, 8), ...field(8, [...str(1, ''), ...num(2, 17)]), ...field(7, graph)];
  return ort.InferenceSession.create(Uint8Array.from(model), webgpu);
}
const add = await oneAdd();
const vocab = 512;
async function addRound(rows: number): Promise<number[]> {
  const x = new ort.Tensor('float32', new Float32Array(rows * vocab).fill(1), [rows, vocab]);
  const ms: number[] = [];
  for (let i = 0; i < STEPS; i++) {
    const t = performance.now();
    const out = await add.run({ x });
    if ((out.y!.data as Float32Array)[0] !== 2) throw new Error('one Add: wrong answer');
    ms.push(performance.now() - t);
  }
  return ms;
}

console.log(machine());
console.log(`model: ${file}; median ms a decode step of ${ROUNDS - 1} rounds of ${STEPS} steps (the first round not counted), the variants in turns`);
console.log('| rows | as served | logits left on the device | one Add, read back |');
console.log('| --- | --- | --- | --- |');
for (const rows of ROWS) {
  const ms = { served: [] as number[], unread: [] as number[], add: [] as number[] };
  for (let r = 0; r < ROUNDS; r++) {
    const turns: Array<[keyof typeof ms, () => Promise<number[]>]> = [
      ['served', () => round(served, rows)],
      ['unread', () => round(unread, rows)],
      ['add', () => addRound(rows)],
    ];
    for (const [name, go] of r % 2 ? turns.reverse() : turns) {
      const steps = await go();
      if (r > 0) ms[name].push(...steps);
    }
  }
  console.log(`| ${rows} | ${fmt(median(ms.served), 2)} | ${fmt(median(ms.unread), 2)} | ${fmt(median(ms.add), 3)} |`);
}
