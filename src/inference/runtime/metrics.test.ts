import { describe, expect, it } from 'vitest';
import { kvCacheUsage } from './metrics.js';

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
