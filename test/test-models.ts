import type { GenerateParams } from '../src/inference/convert/generate.js';

/**
 * A generated model whose steps and loading are long beside the engine's code around them
 * (14.5M parameters, 58 MB in float32): a decode step of ~1 ms on one thread, ~1.4 s of
 * loading on 2 cores, and ~1-2 s to write. Tests that need a message to land inside a step or
 * a signal inside a load use it; the bundled test models' steps are a few tens of microseconds.
 */
export const SLOW_STEP_TEST_SHAPE: GenerateParams = { dim: 384, hiddenDim: 1024, nLayers: 8, nHeads: 6, nKvHeads: 6, vocabSize: 512, seqLen: 1024, seed: 1 };
