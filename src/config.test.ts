import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from './config.js';

describe('loadConfig', () => {
  it('applies defaults', () => {
    const c = loadConfig({});
    expect(c.PORT).toBe(8000);
    expect(c.INFERENCE_PORT).toBe(8001);
    expect(c.MAX_BODY_BYTES).toBe(1 << 20);
    expect(c.EVAL_BODY_BYTES_MAX).toBe(16 << 20);
  });

  it('names the variable, the rule and the value of a bad setting', () => {
    expect(() => loadConfig({ PORT: 'eighty' })).toThrow(ConfigError);
    // A bad value that is accepted must fail the test: the error is caught, then asserted on.
    let msg = '';
    try {
      loadConfig({ PORT: '70000', LOG_LEVEL: 'loud' });
    } catch (e) {
      msg = (e as Error).message;
    }
    expect(msg).toContain('PORT="70000"');
    expect(msg).toContain('65535');
    expect(msg).toContain('LOG_LEVEL="loud"');
  });

  it('takes a thread spin mode, and the booleans it took before the modes', () => {
    expect(loadConfig({}).ORT_INTRA_OP_SPIN).toBe('off');
    expect(loadConfig({}).MODEL_THREADS_SCHED).toBe('normal');
    expect(() => loadConfig({ MODEL_THREADS_SCHED: 'rt' })).toThrow(/MODEL_THREADS_SCHED="rt"/);
    expect(loadConfig({ ORT_INTRA_OP_SPIN: 'run' }).ORT_INTRA_OP_SPIN).toBe('run');
    expect(loadConfig({ ORT_INTRA_OP_SPIN: 'true' }).ORT_INTRA_OP_SPIN).toBe('always');
    expect(loadConfig({ ORT_INTRA_OP_SPIN: '0' }).ORT_INTRA_OP_SPIN).toBe('off');
    expect(() => loadConfig({ ORT_INTRA_OP_SPIN: 'fast' })).toThrow(/ORT_INTRA_OP_SPIN="fast"/);
    expect(loadConfig({}).TOKENS_POST_INTERVAL_MS).toBe(16);
    expect(() => loadConfig({ TOKENS_POST_INTERVAL_MS: '-1' })).toThrow(/TOKENS_POST_INTERVAL_MS="-1"/);
  });

  it('takes one of onnxruntime\'s webgpu validation modes, and leaves it unset by default', () => {
    expect(loadConfig({}).WEBGPU_VALIDATION_MODE).toBeUndefined();
    expect(loadConfig({ WEBGPU_VALIDATION_MODE: 'disabled' }).WEBGPU_VALIDATION_MODE).toBe('disabled');
    expect(() => loadConfig({ WEBGPU_VALIDATION_MODE: 'lenient' })).toThrow(/WEBGPU_VALIDATION_MODE="lenient"/);
  });

  it('treats empty strings as unset', () => {
    expect(loadConfig({ DATABASE_URL: '' }).DATABASE_URL).toBeUndefined();
  });
});
