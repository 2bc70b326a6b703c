// The per-model folder layout: model.onnx (+ model.onnx.data when weights are
// external) and its weight variants (model_q4.onnx, ...), tokenizer.json,
// tokenizer_config.json, config.json (HF-style architecture summary) and
// cloudgate.json (serving metadata), plus source.json recording what the
// folder was built from (for idempotent rebuilds).
import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import type { ServedModel } from '../engine-api.js';
import type { LlamaConfig } from './llama2c.js';
import type { WeightFormat } from './onnx-linear.js';

export type ModelKind = ServedModel['kind'];

/**
 * Weight variants of one model in a folder, named as the Hugging Face
 * onnx-community repositories name them (transformers.js's `dtype`):
 * model{suffix}.onnx, and branch{suffix}.onnx for the evaluation branch graph.
 */
export const DTYPE_SUFFIXES = {
  fp32: '',
  fp16: '_fp16',
  int8: '_int8',
  uint8: '_uint8',
  q8: '_quantized',
  q4: '_q4',
  q4f16: '_q4f16',
  bnb4: '_bnb4',
} as const;
export type ModelDtype = keyof typeof DTYPE_SUFFIXES;
export const MODEL_DTYPES = Object.keys(DTYPE_SUFFIXES) as [ModelDtype, ...ModelDtype[]];

export const modelFileOf = (dtype: ModelDtype): string => `model${DTYPE_SUFFIXES[dtype]}.onnx`;
export const branchFileOf = (dtype: ModelDtype): string => `branch${DTYPE_SUFFIXES[dtype]}.onnx`;

/** The variant each of the converter's `--weights` formats is written as. */
export const FORMAT_DTYPE: Record<WeightFormat, ModelDtype> = { f32: 'fp32', f16: 'fp16', int8: 'int8', int4: 'q4' };

/**
 * cloudgate.json: what the engine serves the model as (`created` in unix
 * seconds); `dtype` picks the weight variant (default fp32: model.onnx).
 */
// One schema for the file, for the converter that writes it and the engine that reads it.
// The vocabulary size is read from the graph at load, not written here.
export const CloudgateModelConfig = z
  .object({
    id: z.string().min(1, 'must be a non-empty string'),
    kind: z.enum(['chat', 'evaluation']),
    contextLength: z.number().int().positive(),
    /** Absent: the engine picks from the context length. */
    maxTokensDefault: z.number().int().positive().optional(),
    maxTokensCap: z.number().int().positive().optional(),
    prices: z.object({ inputPerMTok: z.number().min(0), outputPerMTok: z.number().min(0) }),
    ownedBy: z.string().default('cloudgate'),
    created: z.number().int().min(0).default(0),
    dtype: z.enum(MODEL_DTYPES).default('fp32'),
  })
  .refine((c) => c.maxTokensDefault === undefined || c.maxTokensCap === undefined || c.maxTokensDefault <= c.maxTokensCap, {
    message: 'maxTokensDefault exceeds maxTokensCap',
    path: ['maxTokensDefault'],
  });
/** As written (defaults may be left out). */
export type CloudgateModelConfig = z.input<typeof CloudgateModelConfig>;

/** A cloudgate.json's contents, or an error naming each field at fault. */
export function parseModelConfig(value: unknown): z.output<typeof CloudgateModelConfig> {
  const r = CloudgateModelConfig.safeParse(value);
  if (!r.success) throw new Error(`cloudgate.json: ${r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`);
  return r.data;
}

export interface SourceRecord {
  /** sha256 over the converter version, inputs and options */
  sourceHash: string;
  description: string;
}

export const MODEL_FILES = ['tokenizer.json', 'tokenizer_config.json', 'config.json', 'cloudgate.json'] as const;
export const SOURCE_FILE = 'source.json';
/** The shared-prefix graph evaluation models score question branches with (see onnx-writer.ts). */
export const BRANCH_FILE = 'branch.onnx';

/** One weight variant: model{suffix}.onnx (+ external data), and branch{suffix}.onnx for evaluation models. */
export interface OnnxVariant {
  dtype: ModelDtype;
  model: Uint8Array;
  data?: Uint8Array;
  dataFileName?: string;
  /** evaluation models' shared-prefix graph, reading the same weights file */
  branch?: Uint8Array;
}

export interface ModelDirContents {
  /** every weight variant written; cloudgate.json's `dtype` says which one is served */
  onnx: OnnxVariant[];
  tokenizerJson: unknown;
  tokenizerConfig: unknown;
  cloudgate: CloudgateModelConfig;
  llama: LlamaConfig;
  source?: SourceRecord;
}

/** HF-style config.json for the llama architecture (informational; the ONNX file is self-describing). */
export function hfConfigJson(c: LlamaConfig): Record<string, unknown> {
  return {
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    hidden_size: c.dim,
    intermediate_size: c.hiddenDim,
    num_hidden_layers: c.nLayers,
    num_attention_heads: c.nHeads,
    num_key_value_heads: c.nKvHeads,
    head_dim: c.dim / c.nHeads,
    vocab_size: c.vocabSize,
    max_position_embeddings: c.seqLen,
    rms_norm_eps: c.normEps,
    rope_theta: c.ropeTheta,
    tie_word_embeddings: c.sharedClassifier,
    bos_token_id: 1,
    eos_token_id: 2,
    pad_token_id: 0,
    torch_dtype: 'float32',
  };
}


function writeAtomic(file: string, data: Uint8Array | string): void {
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

const json = (v: unknown): string => JSON.stringify(v, null, 2) + '\n';

/** Write a complete model folder; source.json (if given) is written last as the completion marker. */
export function writeModelDir(outDir: string, c: ModelDirContents): void {
  parseModelConfig(c.cloudgate);
  fs.mkdirSync(outDir, { recursive: true });
  fs.rmSync(path.join(outDir, SOURCE_FILE), { force: true });
  // The converter's own variants not written this time go, so no stale weights are served beside new ones.
  for (const dtype of Object.values(FORMAT_DTYPE)) {
    if (c.onnx.some((v) => v.dtype === dtype)) continue;
    for (const f of [modelFileOf(dtype), `${modelFileOf(dtype)}.data`, branchFileOf(dtype)]) fs.rmSync(path.join(outDir, f), { force: true });
  }
  for (const v of c.onnx) {
    writeAtomic(path.join(outDir, modelFileOf(v.dtype)), v.model);
    const dataName = v.dataFileName ?? `${modelFileOf(v.dtype)}.data`;
    if (v.data) writeAtomic(path.join(outDir, dataName), v.data);
    else fs.rmSync(path.join(outDir, dataName), { force: true });
    if (v.branch) writeAtomic(path.join(outDir, branchFileOf(v.dtype)), v.branch);
    else fs.rmSync(path.join(outDir, branchFileOf(v.dtype)), { force: true });
  }
  // compact tokenizer.json (vocab/merges make it long)
  writeAtomic(path.join(outDir, 'tokenizer.json'), JSON.stringify(c.tokenizerJson));
  writeAtomic(path.join(outDir, 'tokenizer_config.json'), json(c.tokenizerConfig));
  writeAtomic(path.join(outDir, 'config.json'), json(hfConfigJson(c.llama)));
  writeAtomic(path.join(outDir, 'cloudgate.json'), json(c.cloudgate));
  if (c.source) writeAtomic(path.join(outDir, SOURCE_FILE), json(c.source));
}

/** True when every model file (the served variant's included) exists and source.json records `sourceHash`. */
export function modelDirIsCurrent(dir: string, sourceHash: string): boolean {
  try {
    for (const f of MODEL_FILES) if (!fs.statSync(path.join(dir, f)).isFile()) return false;
    const cg = JSON.parse(fs.readFileSync(path.join(dir, 'cloudgate.json'), 'utf8')) as Partial<CloudgateModelConfig>;
    const dtype = cg.dtype ?? 'fp32';
    if (!fs.statSync(path.join(dir, modelFileOf(dtype))).isFile()) return false;
    if (cg.kind === 'evaluation' && !fs.statSync(path.join(dir, branchFileOf(dtype))).isFile()) return false;
    const rec = JSON.parse(fs.readFileSync(path.join(dir, SOURCE_FILE), 'utf8')) as Partial<SourceRecord>;
    return rec.sourceHash === sourceHash;
  } catch {
    return false;
  }
}
