import type { Config } from '../config.js';
import { Engine } from './runtime/engine.js';

/** Builds the engine from the daemon's configuration. */
export function createEngine(c: Config): Promise<Engine> {
  return Engine.load({
    modelsDir: c.modelsDir,
    executionProvider: c.EXECUTION_PROVIDER,
    strict: c.EXECUTION_PROVIDER_STRICT,
    intraOpThreads: c.ORT_INTRA_OP_THREADS,
    options: { admissionWaitMsMax: c.ADMISSION_WAIT_MS_MAX },
    dtype: c.MODEL_DTYPE,
  });
}
