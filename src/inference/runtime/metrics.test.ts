import { describe, expect, it } from 'vitest';
import { registries } from '../../metrics.js';
import { engineMetrics as M, kvCacheUsage } from './metrics.js';

describe('KV-cache usage', () => {
  it('is positions held over batch slots x context length, clamped to 0..1', () => {
    expect(kvCacheUsage(0, 64, 512)).toBe(0);
    expect(kvCacheUsage(512, 64, 512)).toBeCloseTo(1 / 64);
    expect(kvCacheUsage(64 * 512, 64, 512)).toBe(1);
    expect(kvCacheUsage(64 * 512 + 1, 64, 512)).toBe(1);
    expect(kvCacheUsage(-3, 64, 512)).toBe(0);
    expect(kvCacheUsage(10, 0, 512)).toBe(0);
  });
});

describe('a model served by replicas', () => {
  const value = async (name: string, model: string) => (await registries.inference.getSingleMetric(name)!.get()).values.find((v) => v.labels.model_name === model)?.value;

  it('is one series a model: requests and bytes add up, the wait is the shortest, down only when every replica is', async () => {
    const model = 'test/replicated';
    M.running.set({ model, replica: 0 }, 3);
    M.running.set({ model, replica: 1 }, 2);
    expect(await value('vllm:num_requests_running', model)).toBe(5);
    M.running.set({ model, replica: 0 }, 1); // a replica's new value replaces its last
    expect(await value('vllm:num_requests_running', model)).toBe(3);
    M.kvBytes.set({ model, replica: 0 }, 100);
    M.kvBytes.set({ model, replica: 1 }, 50);
    expect(await value('cloudgate_engine_kv_cache_bytes', model)).toBe(150);
    M.admissionWait.set({ model, replica: 0 }, 4);
    M.admissionWait.set({ model, replica: 1 }, 0.5);
    expect(await value('cloudgate_engine_admission_wait_seconds', model)).toBe(0.5);
    M.kvUsage.set({ model, replica: 0 }, 0.2);
    M.kvUsage.set({ model, replica: 1 }, 0.4);
    expect(await value('vllm:kv_cache_usage_perc', model)).toBeCloseTo(0.3);
    M.modelDown.set({ model, replica: 0 }, false);
    M.modelDown.set({ model, replica: 1 }, true);
    expect(await value('cloudgate_engine_model_down', model)).toBe(0);
    M.modelDown.set({ model, replica: 0 }, true);
    expect(await value('cloudgate_engine_model_down', model)).toBe(1);
    // A replica that has not reported yet is no zero in the mean, nor in the shortest wait.
    const late = 'test/replicated-late';
    M.kvUsage.set({ model: late, replica: 1 }, 0.4);
    expect(await value('vllm:kv_cache_usage_perc', late)).toBeCloseTo(0.4);
    M.admissionWait.set({ model: late, replica: 1 }, 2);
    expect(await value('cloudgate_engine_admission_wait_seconds', late)).toBe(2);
    // One worker (no replica index) reads as before.
    M.running.set({ model: 'test/single' }, 7);
    expect(await value('vllm:num_requests_running', 'test/single')).toBe(7);
  });
});
