import ort from 'onnxruntime-node';
import { ResidentSlots, type ResidentLayoutOf, type ResidentSessions } from '../src/inference/runtime/kv-resident.js';
import { withRewrittenGraphConfig } from '../src/inference/runtime/external-data.js';
import { benchArgs, wholeFlag, wholeListFlag } from './lib.js';

// Shared by the webgpu benchmarks that run a slot graph's device-cache sessions themselves.

export const WEBGPU: ort.InferenceSession.SessionOptions = { executionProviders: ['webgpu'] };

/**
 * The flags of a device-cache benchmark: --model (a slot graph), --rows (a list), --steps and
 * --rounds (the first round warms and is not counted, so at least 2).
 */
export function deviceBenchFlags(rowsFallback: number[]): { file: string; rows: number[]; steps: number; rounds: number } {
  const args = benchArgs();
  const file = args.get('model');
  if (!file) throw new Error("--model: a converted chat model's slot-cache graph (model*.onnx)");
  const rows = args.has('rows') ? wholeListFlag(args, 'rows', 1, 1) : rowsFallback;
  return { file, rows, steps: wholeFlag(args, 'steps', 40, 1), rounds: wholeFlag(args, 'rounds', 5, 2) };
}

/** A step session of a device-cache graph (resident-graph.ts) of `file`, its logits read back ('cpu') or left on the device. */
export function residentStep(graph: Uint8Array, file: string, logits: 'cpu' | 'gpu-buffer'): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(graph, withRewrittenGraphConfig({ ...WEBGPU, preferredOutputLocation: { logits, kv_cache_out: 'gpu-buffer' as const } }, file));
}

/** The cache layout of a converted chat model's slot graph, read from its inputs (as the worker's archOf reads its inputs). */
export async function slotGraphLayout(file: string): Promise<ResidentLayoutOf> {
  const probe = await ort.InferenceSession.create(file);
  const keys = probe.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  await probe.release();
  if (!keys.length) throw new Error(`${file} is not a slot-cache chat graph`);
  return { layers: keys.length, kvHeads: Number(keys[0]!.shape[1]), headDim: Number(keys[0]!.shape[3]), positionsMax: 1024 };
}

const NO_LOGITS = { logits: new ort.Tensor('float32', new Float32Array(1), [1, 1]) };
/**
 * A step's outputs with logits left on the device (a 'gpu-buffer' output) given back unread and a
 * placeholder in their place, for the rounds that measure a step issued with nothing read back.
 */
export function logitsUnread(out: ort.InferenceSession.OnnxValueMapType): ort.InferenceSession.OnnxValueMapType {
  if (out.logits!.location !== 'gpu-buffer') return out;
  out.logits!.dispose();
  return { ...out, ...NO_LOGITS };
}

/** Tokens of each sequence's prompt before a round's decode steps. */
const PROMPT_TOKENS = 20;

/**
 * One round on a device-cache graph: `rows` sequences take a 20-token prompt, then `steps` decode
 * steps; each decode step's ms. `run` runs the step graph (`s.step` as it is, by default).
 */
export async function decodeStepMs(
  layout: ResidentLayoutOf,
  s: ResidentSessions,
  rows: number,
  steps: number,
  run: (feeds: Record<string, ort.Tensor>) => Promise<ort.InferenceSession.OnnxValueMapType> = (feeds) => s.step.run(feeds),
): Promise<number[]> {
  const kv = new ResidentSlots(layout, s);
  const seqs = Array.from({ length: rows }, (_, i) => i);
  try {
    await kv.step(seqs.map((seq) => ({ seq, tokens: Array.from({ length: PROMPT_TOKENS }, (_, j) => 5 + ((seq + j) % 200)) })), run);
    const ms: number[] = [];
    for (let i = 0; i < steps; i++) {
      const t = performance.now();
      await kv.step(seqs.map((seq) => ({ seq, tokens: [5 + ((seq + i) % 200)] })), run);
      ms.push(performance.now() - t);
    }
    return ms;
  } finally {
    kv.dispose();
  }
}
