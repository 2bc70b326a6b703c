// High-level entry points: llama2.c checkpoint -> model folder, and seeded
// random model -> model folder.
import crypto from 'node:crypto';
import { parseCheckpoint, parseTokenizerBin, type LlamaCheckpoint } from './llama2c.js';
import { buildLlamaOnnx } from './onnx-writer.js';
import type { WeightFormat } from './onnx-linear.js';
import { buildHfTokenizer, type PieceVocab } from './tokenizer.js';
import { buildByteVocab, generateCheckpoint, type GenerateParams } from './generate.js';
import { QUANT_BLOCK_ELEMENTS } from './quantize.js';
import { FORMAT_DTYPE, writeModelDir, type CloudgateModelConfig, type ModelDirContents, type ModelKind, type OnnxVariant } from './model-config.js';

/** Bump when the ONNX layout or tokenizer output changes, so default models get rebuilt. */
export const CONVERTER_VERSION = 'cloudgate-convert/8';

/** Fixed `created` for the repository's default models (keeps rebuilds byte-identical). */
export const DEFAULT_CREATED = 1767225600; // 2026-01-01T00:00:00Z

/**
 * A variant whose weights take more than this goes to a side file, model*.onnx.data (ONNX external
 * data): a graph is one protobuf message, which has a bound of 2 GiB, and half of it leaves room.
 */
export const EXTERNAL_DATA_THRESHOLD_BYTES = 1024 * 1024 * 1024;

export interface ModelMeta {
  id: string;
  kind: ModelKind;
  contextLength?: number;
  maxTokensDefault?: number;
  maxTokensCap?: number;
  prices?: { inputPerMTok: number; outputPerMTok: number };
  ownedBy?: string;
  created?: number;
  chatTemplate?: string;
  /** weight variants to write (default f32 only); the first is the one cloudgate.json serves */
  weights?: WeightFormat[];
  /** elements per block of the int8 / int4 variants (default QUANT_BLOCK_ELEMENTS by width) */
  quantBlock?: number;
}

export function defaultPrices(kind: ModelKind): { inputPerMTok: number; outputPerMTok: number } {
  return kind === 'chat' ? { inputPerMTok: 0.1, outputPerMTok: 0.2 } : { inputPerMTok: 0.05, outputPerMTok: 0 };
}

function cloudgateConfig(meta: ModelMeta, seqLen: number): CloudgateModelConfig {
  const contextLength = meta.contextLength ?? seqLen;
  const cap = meta.maxTokensCap ?? contextLength;
  return {
    id: meta.id,
    kind: meta.kind,
    contextLength,
    maxTokensDefault: meta.maxTokensDefault ?? Math.min(256, cap),
    maxTokensCap: cap,
    prices: meta.prices ?? defaultPrices(meta.kind),
    ownedBy: meta.ownedBy ?? 'cloudgate',
    created: meta.created ?? Math.floor(Date.now() / 1000),
    ...(meta.weights?.length ? { dtype: FORMAT_DTYPE[meta.weights[0]!] } : {}),
  };
}

export function sha256(...parts: Array<Uint8Array | string>): string {
  const h = crypto.createHash('sha256');
  for (const p of parts) {
    h.update(typeof p === 'string' ? Buffer.from(p, 'utf8') : p);
    h.update('\u0000');
  }
  return h.digest('hex');
}

export function buildModelDirContents(ck: LlamaCheckpoint, vocab: PieceVocab, meta: ModelMeta, sourceHash: string, description: string): ModelDirContents {
  if (vocab.pieces.length !== ck.config.vocabSize) {
    throw new Error(`tokenizer has ${vocab.pieces.length} tokens, the checkpoint has vocab_size ${ck.config.vocabSize}`);
  }
  const cg = cloudgateConfig(meta, ck.config.seqLen);
  if (cg.contextLength > ck.config.seqLen) {
    throw new Error(`contextLength ${cg.contextLength} exceeds the model's max sequence ${ck.config.seqLen}`);
  }
  const tok = buildHfTokenizer(vocab, { modelMaxLength: ck.config.seqLen, chatTemplate: meta.chatTemplate });
  const formats = meta.weights?.length ? meta.weights : (['f32'] as WeightFormat[]);
  if (new Set(formats).size !== formats.length) throw new Error(`weights: ${formats.join(',')} names a format twice`);
  const variants = formats.map((weights): OnnxVariant => {
    const dtype = FORMAT_DTYPE[weights];
    const dataFileName = `${dtype === 'fp32' ? 'model' : `model_${dtype}`}.onnx.data`;
    const external = variantWeightBytes(ck, weights, meta.quantBlock) > EXTERNAL_DATA_THRESHOLD_BYTES;
    const writeOpts = { weights, quantBlock: meta.quantBlock, ...(external ? { externalDataFile: dataFileName } : {}) };
    // Chat models keep their cache in the worker's slots; evaluation models the past layout their branch graph and forks build on.
    const onnx = buildLlamaOnnx(ck, { ...writeOpts, kvLayout: meta.kind === 'chat' ? 'slots' : 'past' });
    // Evaluation models also get the shared-prefix graph for question branches, in every variant; it reads the same weights file.
    const branch = meta.kind === 'evaluation' ? buildLlamaOnnx(ck, { ...writeOpts, sharedPrefix: true }) : undefined;
    if (branch?.data && !Buffer.from(branch.data).equals(Buffer.from(onnx.data!))) throw new Error('branch graph weights differ from the model graph weights');
    return { dtype, ...onnx, dataFileName, branch: branch?.model };
  });
  return {
    onnx: variants,
    tokenizerJson: tok.tokenizerJson,
    tokenizerConfig: tok.tokenizerConfig,
    cloudgate: cg,
    llama: ck.config,
    source: { sourceHash, description },
  };
}

/**
 * What a variant's weights take in its graph, a little over: the embedding table in float32, every
 * product's matrix (the head's too) at the format's width, int8 and int4 with a float32 scale a
 * block. By the float32 size, a 300 M-parameter int4 model (~190 MB) went to a side file it did
 * not need.
 */
export function variantWeightBytes(ck: Pick<LlamaCheckpoint, 'weights'>, weights: WeightFormat, quantBlock?: number): number {
  const w = ck.weights;
  const products = w.wq.length + w.wk.length + w.wv.length + w.wo.length + w.w1.length + w.w2.length + w.w3.length + w.tokenEmbedding.length;
  const bits = weights === 'int8' ? 8 : weights === 'int4' ? 4 : undefined;
  const perWeight = bits ? bits / 8 + 4 / (quantBlock ?? QUANT_BLOCK_ELEMENTS[bits]) : weights === 'f16' ? 2 : 4;
  return 4 * w.tokenEmbedding.length + Math.ceil(products * perWeight);
}

/** JSON with sorted keys at every level (stable input for hashes). */
export function stableJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(stableJson).join(',')}]`;
  if (v && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${stableJson(o[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}

export function metaHash(meta: ModelMeta): string {
  return stableJson(meta);
}

/** Convert llama2.c checkpoint + tokenizer bytes into a model folder. */
export function convertLlama2c(checkpoint: Uint8Array, tokenizerBin: Uint8Array, outDir: string, meta: ModelMeta): ModelDirContents {
  const contents = prepareLlama2c(checkpoint, tokenizerBin, meta);
  writeModelDir(outDir, contents);
  return contents;
}

export function llama2cSourceHash(checkpoint: Uint8Array, tokenizerBin: Uint8Array, meta: ModelMeta): string {
  return sha256(CONVERTER_VERSION, 'llama2c', checkpoint, tokenizerBin, metaHash(meta));
}

export function prepareLlama2c(checkpoint: Uint8Array, tokenizerBin: Uint8Array, meta: ModelMeta): ModelDirContents {
  const ck = parseCheckpoint(checkpoint);
  const vocab = parseTokenizerBin(tokenizerBin, ck.config.vocabSize);
  return buildModelDirContents(ck, vocab, meta, llama2cSourceHash(checkpoint, tokenizerBin, meta), 'converted from a llama2.c checkpoint');
}

export function generatedSourceHash(params: GenerateParams, meta: ModelMeta, tokenizerBin?: Uint8Array): string {
  return sha256(CONVERTER_VERSION, 'generate', stableJson(params), metaHash(meta), tokenizerBin ?? 'builtin-vocab');
}

/**
 * A seeded random-weight model. With `tokenizerBin` (a llama2.c tokenizer.bin
 * whose size must equal params.vocabSize) it uses that vocabulary, otherwise
 * the built-in byte-fallback vocabulary.
 */
export function prepareGenerated(params: GenerateParams, meta: ModelMeta, tokenizerBin?: Uint8Array): ModelDirContents {
  const ck = generateCheckpoint(params);
  const vocab = tokenizerBin ? parseTokenizerBin(tokenizerBin, params.vocabSize) : buildByteVocab(params.vocabSize, params.seed);
  return buildModelDirContents(ck, vocab, meta, generatedSourceHash(params, meta, tokenizerBin), `random weights, seed ${params.seed}`);
}

export function generateModel(params: GenerateParams, outDir: string, meta: ModelMeta, tokenizerBin?: Uint8Array): ModelDirContents {
  const contents = prepareGenerated(params, meta, tokenizerBin);
  writeModelDir(outDir, contents);
  return contents;
}
