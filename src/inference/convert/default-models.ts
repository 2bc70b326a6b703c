// Populates the models folder with the models a fresh clone serves, without
// any download:
//   random-llama       cloudgate/random-llama-chat   chat        (seeded random weights, always)
//   random-llama-eval  cloudgate/random-llama-eval   evaluation  (same weights)
//   stories260k        cloudgate/stories260k         chat        (real weights; only when ../shared/models/stories260K exists)
//   stories260k-eval   cloudgate/stories260k-eval    evaluation  (same)
// Idempotent: a folder whose files exist and whose source.json records the same
// source hash is left alone.
//
//   node dist/src/inference/convert/default-models.js [modelsDir]     (default: $MODELS_DIR or ./models)
//   env SHARED_MODELS_DIR: the shared models folder (default <repo>/../shared/models)
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import {
  DEFAULT_CREATED,
  generatedSourceHash,
  llama2cSourceHash,
  prepareGenerated,
  prepareLlama2c,
  type ModelMeta,
} from './convert.js';
import type { GenerateParams } from './generate.js';
import { modelDirIsCurrent, writeModelDir } from './model-config.js';

/** stories260K-sized random model. */
export const RANDOM_LLAMA_PARAMS: GenerateParams = {
  dim: 64,
  hiddenDim: 172,
  nLayers: 5,
  nHeads: 8,
  nKvHeads: 4,
  vocabSize: 512,
  seqLen: 512,
  seed: 1,
};

const CHAT = { maxTokensDefault: 256, prices: { inputPerMTok: 0.1, outputPerMTok: 0.2 } };
const EVAL = { maxTokensDefault: 32, prices: { inputPerMTok: 0.05, outputPerMTok: 0 } };

export interface DefaultModelResult {
  folder: string;
  id: string;
  action: 'written' | 'up-to-date';
}

/** The repository root: the nearest ancestor of this file holding package.json. */
export function repoRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (fs.existsSync(path.join(dir, 'package.json'))) return dir;
    const up = path.dirname(dir);
    if (up === dir) return process.cwd();
    dir = up;
  }
}

/** Folder holding stories260K.bin and tok512.bin, or null. */
export function findStories260k(sharedModelsDir?: string): string | null {
  const base = sharedModelsDir ?? process.env.SHARED_MODELS_DIR ?? path.resolve(repoRoot(), '..', 'shared', 'models');
  for (const dir of [path.join(base, 'stories260K'), base]) {
    if (fs.existsSync(path.join(dir, 'stories260K.bin')) && fs.existsSync(path.join(dir, 'tok512.bin'))) return dir;
  }
  return null;
}

export function ensureDefaultModels(
  opts: { modelsDir?: string; sharedModelsDir?: string; log?: (line: string) => void } = {},
): DefaultModelResult[] {
  const modelsDir = path.resolve(opts.modelsDir ?? process.env.MODELS_DIR ?? 'models');
  const log = opts.log ?? (() => {});
  fs.mkdirSync(modelsDir, { recursive: true });
  const results: DefaultModelResult[] = [];

  const randomTargets: Array<[string, ModelMeta]> = [
    ['random-llama', { id: 'cloudgate/random-llama-chat', kind: 'chat', created: DEFAULT_CREATED, ...CHAT }],
    ['random-llama-eval', { id: 'cloudgate/random-llama-eval', kind: 'evaluation', created: DEFAULT_CREATED, ...EVAL }],
  ];
  for (const [folder, meta] of randomTargets) {
    const dir = path.join(modelsDir, folder);
    if (modelDirIsCurrent(dir, generatedSourceHash(RANDOM_LLAMA_PARAMS, meta))) {
      results.push({ folder, id: meta.id, action: 'up-to-date' });
      continue;
    }
    writeModelDir(dir, prepareGenerated(RANDOM_LLAMA_PARAMS, meta));
    results.push({ folder, id: meta.id, action: 'written' });
    log(`wrote ${dir} (${meta.id}, random weights)`);
  }

  const stories = findStories260k(opts.sharedModelsDir);
  if (stories) {
    const ck = fs.readFileSync(path.join(stories, 'stories260K.bin'));
    const tok = fs.readFileSync(path.join(stories, 'tok512.bin'));
    const targets: Array<[string, ModelMeta]> = [
      ['stories260k', { id: 'cloudgate/stories260k', kind: 'chat', created: DEFAULT_CREATED, ...CHAT }],
      ['stories260k-eval', { id: 'cloudgate/stories260k-eval', kind: 'evaluation', created: DEFAULT_CREATED, ...EVAL }],
    ];
    for (const [folder, meta] of targets) {
      const dir = path.join(modelsDir, folder);
      if (modelDirIsCurrent(dir, llama2cSourceHash(ck, tok, meta))) {
        results.push({ folder, id: meta.id, action: 'up-to-date' });
        continue;
      }
      writeModelDir(dir, prepareLlama2c(ck, tok, meta));
      results.push({ folder, id: meta.id, action: 'written' });
      log(`wrote ${dir} (${meta.id}, converted from ${stories})`);
    }
  } else {
    log('stories260K not found (set SHARED_MODELS_DIR); only the random-weight models were prepared');
  }
  return results;
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  const t0 = Date.now();
  try {
    const res = ensureDefaultModels({ modelsDir: process.argv[2], log: (l) => console.log(l) });
    const dir = path.resolve(process.argv[2] ?? process.env.MODELS_DIR ?? 'models');
    console.log(`models in ${dir}: ${res.map((r) => `${r.folder} (${r.action})`).join(', ')} [${Date.now() - t0} ms]`);
  } catch (e) {
    console.error(e instanceof Error ? e.stack ?? e.message : String(e));
    process.exit(1);
  }
}
