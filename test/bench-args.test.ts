import { describe, expect, it } from 'vitest';
import { benchArgs } from '../bench/lib.js';

// The benchmarks' argument parser: a bare flag must not swallow the flag after it
// (`--http --streams 16` read as http = '--streams' and a lone '16' dropped the streams).
describe('benchArgs', () => {
  it('reads --name value pairs', () => {
    expect([...benchArgs(['--streams', '16', '--ttft', 'first-token'])]).toEqual([
      ['streams', '16'],
      ['ttft', 'first-token'],
    ]);
  });

  it('reads a bare flag, before another flag or last, as true', () => {
    const a = benchArgs(['--http', '--streams', '16', '--int8-products']);
    expect(a.get('http')).toBe('true');
    expect(a.get('streams')).toBe('16');
    expect(a.get('int8-products')).toBe('true');
  });

  it('keeps a negative number as a value', () => {
    expect(benchArgs(['--offset', '-1']).get('offset')).toBe('-1');
  });
});
