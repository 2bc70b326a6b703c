import ort from 'onnxruntime-node';
import type { ResidentLayoutOf } from '../src/inference/runtime/kv-resident.js';

// Shared by the webgpu benchmarks that run a slot graph's device-cache sessions themselves.

/** The cache layout of a converted chat model's slot graph, read from its inputs (as the worker's archOf reads its inputs). */
export async function slotGraphLayout(file: string): Promise<ResidentLayoutOf> {
  const probe = await ort.InferenceSession.create(file);
  const keys = probe.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name)) as ort.InferenceSession.TensorValueMetadata[];
  await probe.release();
  if (!keys.length) throw new Error(`${file} is not a slot-cache chat graph`);
  return { layers: keys.length, kvHeads: Number(keys[0]!.shape[1]), headDim: Number(keys[0]!.shape[3]), positionsMax: 1024 };
}
