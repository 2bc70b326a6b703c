import { describe, expect, it } from 'vitest';
import { corsHeaders, parseCorsOrigins, preflightHeaders } from './cors.js';

describe('CORS_ORIGINS', () => {
  it('parses exact origins or * and refuses anything else, naming it', () => {
    expect(parseCorsOrigins('')).toEqual(new Set());
    expect(parseCorsOrigins('*')).toBe('*');
    expect(parseCorsOrigins('https://a.example, http://localhost:3000')).toEqual(new Set(['https://a.example', 'http://localhost:3000']));
    expect(() => parseCorsOrigins('https://a.example/path')).toThrow('"https://a.example/path" is not an origin');
    expect(() => parseCorsOrigins('a.example')).toThrow('"a.example"');
  });

  it('allows listed origins only, and * for any', () => {
    const list = parseCorsOrigins('https://a.example');
    expect(corsHeaders(list, 'https://a.example')?.['access-control-allow-origin']).toBe('https://a.example');
    expect(corsHeaders(list, 'https://b.example')).toBeUndefined();
    expect(corsHeaders(list, undefined)).toBeUndefined();
    expect(corsHeaders('*', 'https://b.example')?.['access-control-allow-origin']).toBe('*');
    expect(preflightHeaders(list, 'https://a.example', 'authorization')?.['access-control-allow-headers']).toBe('authorization');
  });
});
