// The per-model folder layout: model.onnx (+ model.onnx.data when weights are
// external), tokenizer.json, tokenizer_config.json, config.json (HF-style
// architecture summary) and cloudgate.json (serving metadata), plus
// source.json recording what the folder was built from (for idempotent rebuilds).
import fs from 'node:fs';
import path from 'node:path';
import type { ServedModel } from '../engine-api.js';
import type { LlamaConfig } from './llama2c.js';

export type ModelKind = ServedModel['kind'];

/** cloudgate.json: what the engine serves the model as (`created` in unix seconds). */
// The vocabulary size is read from the graph at load, not written in cloudgate.json.
export type CloudgateModelConfig = Omit<ServedModel, 'vocabSize' | 'structuredOutput' | 'charsPerTokenMax'>;

export interface SourceRecord {
  /** sha256 over the converter version, inputs and options */
  sourceHash: string;
  description: string;
}

export const MODEL_FILES = ['model.onnx', 'tokenizer.json', 'tokenizer_config.json', 'config.json', 'cloudgate.json'] as const;
export const SOURCE_FILE = 'source.json';
/** The shared-prefix graph evaluation models score question branches with (see onnx-writer.ts). */
export const BRANCH_FILE = 'branch.onnx';

export interface ModelDirContents {
  /** `branch`: evaluation models' shared-prefix graph (branch.onnx), reading the same weights file. */
  onnx: { model: Uint8Array; data?: Uint8Array; dataFileName?: string; branch?: Uint8Array };
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

export function validateModelConfig(c: CloudgateModelConfig): void {
  const bad = (m: string): never => {
    throw new Error(`cloudgate.json: ${m}`);
  };
  if (!c.id || typeof c.id !== 'string') bad('id must be a non-empty string');
  if (c.kind !== 'chat' && c.kind !== 'evaluation') bad(`kind must be chat or evaluation, got ${String(c.kind)}`);
  for (const k of ['contextLength', 'maxTokensDefault', 'maxTokensCap', 'created'] as const) {
    if (!Number.isInteger(c[k]) || c[k] < 0) bad(`${k} must be a non-negative integer`);
  }
  if (c.maxTokensDefault > c.maxTokensCap) bad('maxTokensDefault exceeds maxTokensCap');
  if (!(c.prices.inputPerMTok >= 0) || !(c.prices.outputPerMTok >= 0)) bad('prices must be non-negative numbers');
}

function writeAtomic(file: string, data: Uint8Array | string): void {
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

const json = (v: unknown): string => JSON.stringify(v, null, 2) + '\n';

/** Write a complete model folder; source.json (if given) is written last as the completion marker. */
export function writeModelDir(outDir: string, c: ModelDirContents): void {
  validateModelConfig(c.cloudgate);
  fs.mkdirSync(outDir, { recursive: true });
  fs.rmSync(path.join(outDir, SOURCE_FILE), { force: true });
  writeAtomic(path.join(outDir, 'model.onnx'), c.onnx.model);
  const dataName = c.onnx.dataFileName ?? 'model.onnx.data';
  if (c.onnx.data) writeAtomic(path.join(outDir, dataName), c.onnx.data);
  else fs.rmSync(path.join(outDir, dataName), { force: true });
  if (c.onnx.branch) writeAtomic(path.join(outDir, BRANCH_FILE), c.onnx.branch);
  else fs.rmSync(path.join(outDir, BRANCH_FILE), { force: true });
  // compact tokenizer.json (vocab/merges make it long)
  writeAtomic(path.join(outDir, 'tokenizer.json'), JSON.stringify(c.tokenizerJson));
  writeAtomic(path.join(outDir, 'tokenizer_config.json'), json(c.tokenizerConfig));
  writeAtomic(path.join(outDir, 'config.json'), json(hfConfigJson(c.llama)));
  writeAtomic(path.join(outDir, 'cloudgate.json'), json(c.cloudgate));
  if (c.source) writeAtomic(path.join(outDir, SOURCE_FILE), json(c.source));
}

/** True when every model file exists and source.json records `sourceHash`. */
export function modelDirIsCurrent(dir: string, sourceHash: string): boolean {
  try {
    for (const f of MODEL_FILES) if (!fs.statSync(path.join(dir, f)).isFile()) return false;
    const kind = (JSON.parse(fs.readFileSync(path.join(dir, 'cloudgate.json'), 'utf8')) as Partial<CloudgateModelConfig>).kind;
    if (kind === 'evaluation' && !fs.statSync(path.join(dir, BRANCH_FILE)).isFile()) return false;
    const rec = JSON.parse(fs.readFileSync(path.join(dir, SOURCE_FILE), 'utf8')) as Partial<SourceRecord>;
    return rec.sourceHash === sourceHash;
  } catch {
    return false;
  }
}
