import { describe, expect, it } from 'vitest';
import { engineError } from './outcome.js';

describe('engineError', () => {
  it('tells a shutdown, a restarting worker and a failed model apart', () => {
    expect(engineError({ message: 'm is shutting down', retryable: true, shuttingDown: true })).toMatchObject({ kind: 'unavailable', code: 'shutting_down', retryAfterMs: 1_000 });
    expect(engineError({ message: 'restarting', retryable: true })).toMatchObject({ kind: 'unavailable', code: 'engine_restarting', retryAfterMs: 2_000 });
    expect(engineError({ message: 'failed', retryable: false })).toMatchObject({ kind: 'internal', code: 'engine_failed' });
  });
});
