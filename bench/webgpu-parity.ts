import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { findStories260k } from '../src/inference/convert/default-models.js';
import { evaluationProbabilities, greedyTokens, largestChange, leadingAgreement, writeStoriesVariants } from '../src/inference/convert/variant-quality.js';
import { Engine } from '../src/inference/runtime/engine.js';
import { machine } from './lib.js';

// What EXECUTION_PROVIDER=webgpu serves next to the CPU, on a machine that has a Vulkan device
// (src/inference/runtime/webgpu.test.ts checks the same where vitest runs): stories260K at each
// weight width, 40 greedy tokens of "Once upon a time" and the evaluation bench's 64 questions.
// Usage: node dist/bench/webgpu-parity.js (SHARED_MODELS_DIR names the folder with stories260K/)

async function main() {
  const stories = findStories260k();
  if (!stories) throw new Error('stories260K not found: set SHARED_MODELS_DIR');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'webgpu-parity-'));
  try {
    writeStoriesVariants(dir, stories);
    console.log(`machine: ${machine()}`);
    for (const dtype of [undefined, 'int8', 'q4'] as const) {
      const run = async (executionProvider: 'cpu' | 'webgpu') => {
        const t0 = performance.now();
        const e = await Engine.load({ modelsDir: dir, executionProvider, strict: true, intraOpThreads: 1, dtype });
        const loadMs = performance.now() - t0;
        try {
          return { once: await greedyTokens(e, 's/chat', 'Once upon a time'), probs: await evaluationProbabilities(e, 's/evaluation'), loadMs };
        } finally {
          await e.close();
        }
      };
      const cpu = await run('cpu');
      const gpu = await run('webgpu');
      console.log(
        `stories260K ${dtype ?? 'fp32'}: webgpu's greedy tokens equal the CPU's for ${leadingAgreement(gpu.once, cpu.once)} of ${cpu.once.length}; ` +
          `largest evaluation probability change ${largestChange(gpu.probs, cpu.probs).toFixed(4)}; load ${gpu.loadMs.toFixed(0)} ms (cpu ${cpu.loadMs.toFixed(0)} ms)`,
      );
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
