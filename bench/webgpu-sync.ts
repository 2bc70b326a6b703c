import fs from 'node:fs';
import ort from 'onnxruntime-node';
import { residentSessions, type ResidentSessions } from '../src/inference/runtime/kv-resident.js';
import { residentGraph } from '../src/inference/runtime/resident-graph.js';
import { fmt, machine, median } from './lib.js';
import { decodeStepMs, deviceBenchFlags, logitsUnread, residentStep, slotGraphLayout, WEBGPU } from './slot-graph.js';
import { GraphBuilder } from '../src/inference/convert/onnx-graph.js';

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

const { file, rows: ROWS, steps: STEPS, rounds: ROUNDS } = deviceBenchFlags([1, 16]);

const layout = await slotGraphLayout(file);
const served = await residentSessions(file, layout, WEBGPU);
if (!served) throw new Error(`${file} has no single new_key_values output: convert it again`);
const unread: ResidentSessions = {
  step: await residentStep(residentGraph(fs.readFileSync(file), layout)!, file, 'gpu-buffer'),
  grow: served.grow,
};

/** Decode steps of `rows` sequences on `s`: each step's ms. Logits left on the device are given back unread. */
async function round(s: ResidentSessions, rows: number): Promise<number[]> {
  return decodeStepMs(layout, s, rows, STEPS, async (feeds) => logitsUnread(await s.step.run(feeds)));
}

/** A graph of one Add on webgpu: y = x + x, float32 [rows, vocab]. */
async function oneAdd(): Promise<ort.InferenceSession> {
  const gb = new GraphBuilder();
  const x = gb.input('x', 'float32', ['rows', 'vocab']);
  gb.op('Add', [x, x], {}, ['y']);
  gb.output('y', 'float32', ['rows', 'vocab']);
  return ort.InferenceSession.create(gb.encode({ graphName: 'one-add', opset: 17, producer: 'cloudgate' }).model, WEBGPU);
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
