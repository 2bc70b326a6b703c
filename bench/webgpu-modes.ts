import ort from 'onnxruntime-node';
import { residentSessions, type ResidentSessions } from '../src/inference/runtime/kv-resident.js';
import { benchArgs, fmt, machine, median } from './lib.js';
import { decodeStepMs, slotGraphLayout } from './slot-graph.js';

// One decode step of the device-cache graph (runtime/resident-graph.ts, as the daemon runs a chat
// model on webgpu) under each of onnxruntime's webgpu `validationMode`s, to see what the host's
// per-dispatch checks cost a step: one stream on an H100 was bounded by Dawn's dispatches, a few
// hundred a step (bench/README.md "GPU: the KV cache on the device"). Each mode gets its own
// sessions; a round runs 20-token prompts for `rows` sequences, then `steps` decode steps, the
// modes in turns (the order alternating), the first round not counted. On lavapipe (Mesa's CPU
// Vulkan) the kernels themselves bound a step, so only a GPU says anything.
// Usage: node dist/bench/webgpu-modes.js --model DIR/model_q4.onnx [--modes basic,wgpuOnly,disabled] [--rows 1,16] [--steps 40] [--rounds 5]

const args = benchArgs();
const file = args.get('model');
if (!file) throw new Error('--model: a converted chat model\'s slot-cache graph (model*.onnx)');
const MODES = (args.get('modes') ?? 'basic,wgpuOnly,disabled').split(',') as Array<'basic' | 'wgpuOnly' | 'disabled' | 'full'>;
const ROWS = (args.get('rows') ?? '1,16').split(',').map(Number);
const STEPS = Number(args.get('steps') ?? 40);
const ROUNDS = Number(args.get('rounds') ?? 5);

const layout = await slotGraphLayout(file);
const sessions = new Map<string, ResidentSessions>();
for (const mode of MODES) {
  const ep = [{ name: 'webgpu', validationMode: mode } as ort.InferenceSession.ExecutionProviderConfig];
  const s = await residentSessions(file, layout, { executionProviders: ep });
  if (!s) throw new Error(`${file} has no single new_key_values output: convert it again`);
  sessions.set(mode, s);
}

console.log(machine());
console.log(`model: ${file}; decode steps of the device-cache graph on webgpu, median ms of ${ROUNDS - 1} rounds of ${STEPS} steps (the first round not counted), modes in turns`);
console.log(`| rows | ${MODES.join(' | ')} |`);
console.log(`| --- | ${MODES.map(() => '---').join(' | ')} |`);
for (const rows of ROWS) {
  const ms = new Map<string, number[]>(MODES.map((m) => [m, []]));
  for (let r = 0; r < ROUNDS; r++) {
    for (const mode of r % 2 ? [...MODES].reverse() : MODES) {
      const steps = await decodeStepMs(layout, sessions.get(mode)!, rows, STEPS);
      if (r > 0) ms.get(mode)!.push(...steps);
    }
  }
  console.log(`| ${rows} | ${MODES.map((m) => fmt(median(ms.get(m)!), 2)).join(' | ')} |`);
}
