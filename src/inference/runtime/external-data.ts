import fs from 'node:fs';
import path from 'node:path';
import onnxProto from 'onnx-proto';

// The graphs the worker rewrites at load (prefill-graph.ts, resident-graph.ts) reach onnxruntime
// as bytes, and a graph given as bytes has no folder. A model may keep its weights in a file
// beside its graph (ONNX external data: every model past protobuf's 2 GB, and the converter's
// whenever a variant's weights pass 1 GiB, convert.ts variantWeightBytes): the rewrite reads them from there, and
// the session finds the ones it leaves in place from the model file's folder.

const { onnx } = onnxProto;
type Tensor = onnxProto.onnx.ITensorProto;

/** The session config entries (onnxruntime-node's `extra.session`) of a graph rewritten from the model file `modelPath`. */
export function rewrittenGraphSessionConfig(modelPath: string): Record<string, string> {
  return { model_external_initializers_file_folder_path: path.dirname(path.resolve(modelPath)) };
}

/** `options` with rewrittenGraphSessionConfig's entries added to its own session config. */
export function withRewrittenGraphConfig<T extends { extra?: Record<string, unknown> }>(options: T, modelPath: string): T {
  const session = (options.extra?.session ?? {}) as Record<string, unknown>;
  return { ...options, extra: { ...options.extra, session: { ...session, ...rewrittenGraphSessionConfig(modelPath) } } };
}

export const isExternal = (t: Tensor): boolean => t.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL;

/**
 * `t` with its bytes in `rawData`: itself where it holds them, else read from its file in `dir`
 * (onnx's external data entries `location`, `offset`, `length`). Throws where the file lies
 * outside `dir` (onnxruntime refuses those too) or is shorter than the entries say.
 */
export function withData(t: Tensor, dir: string): Tensor {
  if (!isExternal(t)) return t;
  const entry = new Map((t.externalData ?? []).map((e) => [e.key, e.value]));
  const location = entry.get('location');
  if (!location) throw new Error(`initializer ${t.name}: its external data names no location`);
  const file = path.resolve(dir, location);
  const rel = path.relative(path.resolve(dir), file);
  if (rel.startsWith('..') || path.isAbsolute(rel)) throw new Error(`initializer ${t.name}: its external data ${location} lies outside the model's folder`);
  const offset = Number(entry.get('offset') ?? 0);
  const length = entry.has('length') ? Number(entry.get('length')) : fs.statSync(file).size - offset;
  const rawData = Buffer.alloc(length);
  const fd = fs.openSync(file, 'r');
  try {
    const read = fs.readSync(fd, rawData, 0, length, offset);
    if (read !== length) throw new Error(`initializer ${t.name}: ${location} holds ${read} of its ${length} bytes at offset ${offset}`);
  } finally {
    fs.closeSync(fd);
  }
  return { name: t.name, dataType: t.dataType, dims: t.dims, rawData };
}
