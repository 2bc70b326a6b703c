import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadTokenizer, readTokenizerFiles } from './tokenizer.js';

const dir = path.resolve(import.meta.dirname, '../../../models/random-llama');

describe('loadTokenizer', () => {
  it('keeps the BPE cache to words: distinct short texts do not pile up in it', () => {
    const t = loadTokenizer(readTokenizerFiles(dir));
    const cache = (t as unknown as { model: { cache: { cache: Map<string, unknown> } } }).model.cache.cache;
    for (let i = 0; i < 3000; i++) t.encode(`state ${i} of a short evaluation, under the library's own 256 characters`);
    // A Metaspace tokenizer does not split words: each text above is one pre-token, too long to cache.
    expect(cache.size).toBeLessThan(50);
    for (let i = 0; i < 3000; i++) t.encode(`w${i}`);
    expect(cache.size).toBeLessThanOrEqual(2000);
    // Encoding is the same with the bounded cache.
    const fresh = loadTokenizer(readTokenizerFiles(dir));
    expect(t.encode('state 7 of a short evaluation').ids).toEqual(fresh.encode('state 7 of a short evaluation').ids);
  });
});
