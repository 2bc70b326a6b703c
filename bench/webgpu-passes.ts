import fs from 'node:fs';
import ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { residentSessions, type ResidentSessions } from '../src/inference/runtime/kv-resident.js';
import { residentGraph } from '../src/inference/runtime/resident-graph.js';
import { DEVICE_PASSES } from '../src/inference/runtime/device-passes.js';
import { benchArgs, fmt, machine, median, threadCpuMs } from './lib.js';
import { decodeStepMs, deviceBenchFlags, logitsUnread, residentStep, slotGraphLayout, WEBGPU } from './slot-graph.js';

// What the device passes (runtime/device-passes.ts) save a decode step of the device-cache graph
// on webgpu. Variants: no pass, then the passes added one at a time in their order (the last is
// the graph as served), or the sets `--sets` names (each the passes' 1-based places in their
// order, 0 for none: `--sets 0,1,2,12` runs each alone and both).
// For each, at each row count, the median of:
// - `step`: a step as served, its logits read back (what a stream waits for);
// - `issued`: the same graph with its logits left on the device, so run() returns once the step
//   is issued (bench/webgpu-sync.ts);
// - `host CPU`: the thread issuing the steps, its CPU time a step over the `issued` rounds (from
//   /proc: on lavapipe, Mesa's CPU Vulkan, the kernels' own threads share the cores, so wall
//   times there say little and this says what the host spends).
// Also each variant's largest logit change against no pass, on the first decode step.
// Usage: node dist/bench/webgpu-passes.js --model DIR/model_q4.onnx [--rows 1,16,64] [--steps 40] [--rounds 5] [--sets 0,1,12,123]

const args = benchArgs();
const { file, rows: ROWS, steps: STEPS, rounds: ROUNDS } = deviceBenchFlags([1, 16, 64]);

const layout = await slotGraphLayout(file);
// The grow graph as served; the served step session is not one of the variants.
const served = await residentSessions(file, layout, WEBGPU);
if (!served) throw new Error(`${file} has no single new_key_values output: convert it again`);
await served.step.release();
const grow = served.grow;
const bytes = fs.readFileSync(file);
interface Variant {
  name: string;
  nodes: number;
  served: ResidentSessions;
  unread: ResidentSessions;
}
const variants: Variant[] = [];
const cumulative = DEVICE_PASSES.map((_, n) => Array.from({ length: n + 1 }, (_, i) => String(i + 1)).join(''));
const SETS = (args.get('sets') ?? ['0', ...cumulative].join(',')).split(',');
for (const set of SETS) {
  const chosen = set === '0' ? [] : [...set].map((d) => DEVICE_PASSES[Number(d) - 1]);
  if (chosen.some((p) => !p)) throw new Error(`--sets: ${set} names no pass (1 to ${DEVICE_PASSES.length}, or 0 for none)`);
  const passes = chosen as typeof DEVICE_PASSES;
  const graph = residentGraph(bytes, layout, passes)!;
  variants.push({
    name: passes.length ? passes.map((p) => p.name).join(' + ') : 'no pass',
    nodes: onnxProto.onnx.ModelProto.decode(graph).graph!.node!.length,
    served: { step: await residentStep(graph, file, 'cpu'), grow },
    unread: { step: await residentStep(graph, file, 'gpu-buffer'), grow },
  });
}

/** Runs `s.step`, giving logits left on the device back unread; where `first` is given, the first decode step's logits kept in it. */
function runner(s: ResidentSessions, first?: { logits?: Float32Array }) {
  let steps = 0;
  return async (feeds: Record<string, ort.Tensor>) => {
    const out = logitsUnread(await s.step.run(feeds));
    if (first && steps++ === 1) first.logits = Float32Array.from(out.logits!.data as Float32Array);
    return out;
  };
}

console.log(machine());
console.log(`model: ${file}; decode steps of the device-cache graph on webgpu, median of ${ROUNDS - 1} rounds of ${STEPS} steps (the first round not counted), the variants in turns`);
console.log(`nodes: ${variants.map((v) => `${v.name} ${v.nodes}`).join(', ')}`);
console.log('| rows | variant | step ms | issued ms | host CPU ms a step | largest logit change |');
console.log('| --- | --- | --- | --- | --- | --- |');
for (const rows of ROWS) {
  const ms = variants.map(() => ({ step: [] as number[], issued: [] as number[], cpu: 0, steps: 0, first: {} as { logits?: Float32Array } }));
  for (let r = 0; r < ROUNDS; r++) {
    const order = variants.map((_, i) => i);
    for (const i of r % 2 ? order.reverse() : order) {
      const v = variants[i]!;
      const m = ms[i]!;
      const step = await decodeStepMs(layout, v.served, rows, STEPS, runner(v.served, m.first));
      const cpu = threadCpuMs(process.pid, process.pid);
      const issued = await decodeStepMs(layout, v.unread, rows, STEPS, runner(v.unread));
      if (r === 0) continue;
      m.cpu += threadCpuMs(process.pid, process.pid) - cpu;
      m.steps += STEPS + 1;
      m.step.push(...step);
      m.issued.push(...issued);
    }
  }
  const base = ms[0]!.first.logits!;
  variants.forEach((v, i) => {
    const m = ms[i]!;
    const change = m.first.logits!.reduce((worst, x, j) => Math.max(worst, Math.abs(x - base[j]!)), 0);
    console.log(`| ${rows} | ${v.name} | ${fmt(median(m.step), 2)} | ${fmt(median(m.issued), 2)} | ${fmt(m.cpu / m.steps, 2)} | ${change.toExponential(1)} |`);
  });
}
