import ort from 'onnxruntime-node';
import { ResidentSlots, type ResidentLayoutOf, type ResidentSessions } from '../src/inference/runtime/kv-resident.js';

// Shared by the webgpu benchmarks that run a slot graph's device-cache sessions themselves.

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
