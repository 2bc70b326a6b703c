import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { log } from '../../log.js';
import type { ServedModel } from '../engine-api.js';
import type { RuntimeOptions, SchedulerOptions } from './options.js';
import { ModelWorker } from './runner.js';
import { ModelTokenizer } from './tokenizer.js';

// The model registry: every folder of the models dir with a cloudgate.json is
// a model. A folder that fails (bad config, missing files, a graph the engine
// cannot drive) is skipped with a log line; the others still serve.
// Architecture facts come from the ONNX graph (read in the worker), end
// tokens from tokenizer_config / generation_config.

export const ModelConfigSchema = z
  .object({
    id: z.string().min(1).max(200),
    kind: z.enum(['chat', 'evaluation']),
    contextLength: z.number().int().positive(),
    maxTokensDefault: z.number().int().positive().optional(),
    maxTokensCap: z.number().int().positive().optional(),
    prices: z.object({ inputPerMTok: z.number().min(0), outputPerMTok: z.number().min(0) }),
    ownedBy: z.string().min(1).default('cloudgate'),
    created: z.number().int().min(0).default(0),
  })
  .superRefine((c, ctx) => {
    if (c.maxTokensCap !== undefined && c.maxTokensCap > c.contextLength) ctx.addIssue({ code: 'custom', message: 'maxTokensCap exceeds contextLength', path: ['maxTokensCap'] });
    if (c.maxTokensDefault !== undefined && c.maxTokensDefault > (c.maxTokensCap ?? c.contextLength)) {
      ctx.addIssue({ code: 'custom', message: 'maxTokensDefault exceeds maxTokensCap', path: ['maxTokensDefault'] });
    }
  });

export type ModelConfig = z.infer<typeof ModelConfigSchema>;

/** A model folder whose config and files look right (nothing loaded yet). */
export interface FoundModel {
  dir: string;
  info: ServedModel;
}

export interface SkippedFolder {
  dir: string;
  reason: string;
}

export function servedModel(c: ModelConfig): ServedModel {
  const cap = c.maxTokensCap ?? c.contextLength;
  return {
    id: c.id,
    kind: c.kind,
    contextLength: c.contextLength,
    maxTokensCap: cap,
    maxTokensDefault: c.maxTokensDefault ?? Math.min(256, cap),
    prices: c.prices,
    ownedBy: c.ownedBy,
    created: c.created,
  };
}

/** Folders of `modelsDir` with a valid cloudgate.json and the files a model needs, sorted by folder name. */
export function scanModels(modelsDir: string): { found: FoundModel[]; skipped: SkippedFolder[] } {
  const found: FoundModel[] = [];
  const skipped: SkippedFolder[] = [];
  if (!fs.existsSync(modelsDir)) return { found, skipped };
  const ids = new Set<string>();
  for (const name of fs.readdirSync(modelsDir).sort()) {
    const dir = path.join(modelsDir, name);
    const cfgFile = path.join(dir, 'cloudgate.json');
    if (!fs.existsSync(cfgFile)) continue;
    try {
      let raw: unknown;
      try {
        raw = JSON.parse(fs.readFileSync(cfgFile, 'utf8'));
      } catch (e) {
        throw new Error(`cloudgate.json is not JSON: ${(e as Error).message}`);
      }
      const parsed = ModelConfigSchema.safeParse(raw);
      if (!parsed.success) throw new Error(`cloudgate.json: ${parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`);
      for (const f of ['model.onnx', 'tokenizer.json']) if (!fs.existsSync(path.join(dir, f))) throw new Error(`${f} missing`);
      if (ids.has(parsed.data.id)) throw new Error(`duplicate model id ${parsed.data.id}`);
      ids.add(parsed.data.id);
      found.push({ dir, info: servedModel(parsed.data) });
    } catch (e) {
      skipped.push({ dir, reason: (e as Error).message });
    }
  }
  return { found, skipped };
}

export interface LoadedModel {
  dir: string;
  info: ServedModel;
  tokenizer: ModelTokenizer;
  worker: ModelWorker;
}

/** Loads one found model: tokenizer on this thread, ONNX session in its own worker. */
export async function loadModel(m: FoundModel, runtime: RuntimeOptions, sched: Pick<SchedulerOptions, 'kvPadWasteRatioMax'>): Promise<LoadedModel> {
  const tokenizer = new ModelTokenizer(m.dir);
  if (m.info.kind === 'chat' && !tokenizer.hasChatTemplate) log.warn({ model: m.info.id }, 'no chat_template in tokenizer_config.json; a plain "role: content" layout is used');
  if (tokenizer.eosIds.size === 0 && m.info.kind === 'chat') log.warn({ model: m.info.id }, 'no end-of-sequence token found; generations end by max_tokens or stop strings only');
  const worker = await ModelWorker.start({
    modelPath: path.join(m.dir, 'model.onnx'),
    executionProvider: runtime.executionProvider,
    executionProviderStrict: runtime.executionProviderStrict,
    intraOpThreads: runtime.intraOpThreads,
    kvPadWasteRatioMax: sched.kvPadWasteRatioMax,
  });
  log.info({ model: m.info.id, kind: m.info.kind, provider: worker.arch.provider, requestedProvider: runtime.executionProvider, arch: worker.arch }, 'model loaded');
  return { dir: m.dir, info: m.info, tokenizer, worker };
}
