import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../errors.js';
import { argmax, sample, seededRandom, topPSet } from './sampler.js';
import { StopMatcher } from './stop.js';
import { Detokenizer, ModelTokenizer } from './tokenizer.js';

// Unit tests of the pieces that need no model session: sampler, stop strings,
// tokenizer, chat template and incremental detokenisation.

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const SHARED = path.resolve(process.env.SHARED_MODELS_DIR ?? path.join(repo, '../shared/models'));
const HF = path.join(SHARED, 'tiny-random-llama-hf');

describe('sampler', () => {
  it('greedy picks the highest logit, ties to the lowest id', () => {
    expect(argmax(new Float32Array([0, 3, 1, 3]), 0, 4)).toBe(1);
    expect(sample(new Float32Array([9, 2, 5, 5]), 1, 3, { temperature: 0, topP: 1 }, () => 0.5)).toBe(1);
  });

  it('a seed reproduces the same draws; another seed differs', () => {
    const logits = new Float32Array(Array.from({ length: 50 }, (_, i) => Math.sin(i)));
    const run = (seed: number) => {
      const r = seededRandom(seed);
      return Array.from({ length: 40 }, () => sample(logits, 0, 50, { temperature: 1, topP: 1 }, r));
    };
    expect(run(7)).toEqual(run(7));
    expect(run(7)).not.toEqual(run(8));
  });

  it('top_p keeps the smallest most likely set reaching the mass (ties by id)', () => {
    const w = new Float64Array([0.1, 0.4, 0.2, 0.2, 0.1]);
    expect(topPSet(w, 5, 0.5)).toEqual([1, 2]);
    expect(topPSet(w, 5, 0.8)).toEqual([1, 2, 3]);
    const big = new Float64Array(1000).fill(1);
    expect(topPSet(big, 1000, 300).length).toBe(300); // needs more than the first 64 candidates
    // sampling never leaves the nucleus
    const logits = new Float32Array([Math.log(0.5), Math.log(0.3), Math.log(0.15), Math.log(0.05)]);
    const r = seededRandom(1);
    for (let i = 0; i < 200; i++) expect(sample(logits, 0, 4, { temperature: 1, topP: 0.7 }, r)).toBeLessThan(2);
  });
});

describe('stop strings', () => {
  it('stops across pieces, never emitting the stop string or what follows', () => {
    const m = new StopMatcher(['END']);
    const outs = ['Hello E', 'N', 'Dmore'].map((t) => m.push(t));
    expect(outs.map((o) => o.out).join('')).toBe('Hello ');
    expect(outs[2]!.stopped).toBe(true);
  });

  it('holds back only a tail that can still begin a stop string', () => {
    const m = new StopMatcher(['abc', 'xyz']);
    expect(m.push('hello a')).toEqual({ out: 'hello ', stopped: false });
    expect(m.push('b')).toEqual({ out: '', stopped: false });
    expect(m.push('d')).toEqual({ out: 'abd', stopped: false });
    expect(m.push('x')).toEqual({ out: '', stopped: false });
    expect(m.flush()).toBe('x');
  });

  it('picks the earliest of several stop strings and passes text through with none', () => {
    const m = new StopMatcher(['cd', 'bcdef']);
    expect(m.push('abcdef')).toEqual({ out: 'a', stopped: true });
    expect(new StopMatcher([]).push('anything')).toEqual({ out: 'anything', stopped: false });
  });
});

describe.skipIf(!fs.existsSync(HF))('tokenizer and chat template (tiny-random-llama-hf: Llama-2 tokenizer, [INST] template)', () => {
  const tok = fs.existsSync(HF) ? new ModelTokenizer(HF) : (undefined as unknown as ModelTokenizer);

  it('renders the template with BOS once and reads the end token', () => {
    const ids = tok.encodeChat([{ role: 'user', content: 'Hello there' }]);
    expect(ids[0]).toBe(tok.bosId);
    expect(ids.filter((t) => t === tok.bosId).length).toBe(1);
    expect(tok.decode(ids)).toBe('[INST] Hello there [/INST]');
    expect([...tok.eosIds]).toContain(2);
    expect(tok.bosTokens()).toEqual([1]);
  });

  it('turns a template error into invalid messages', () => {
    let err: unknown;
    try {
      tok.encodeChat([{ role: 'assistant', content: 'a' }, { role: 'assistant', content: 'b' }]);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).param).toBe('messages');
  });

  it('detokenises incrementally without U+FFFD halves (byte-fallback characters split over tokens)', () => {
    const text = 'Grüße, 世界! 😀 naïve café';
    const ids = tok.encode(text);
    expect(ids.some((id) => /^<0x[0-9A-F]{2}>$/.test(tok.tokenizer.id_to_token(id) ?? ''))).toBe(true); // byte fallback in play
    const d = new Detokenizer(tok, []);
    const pieces = ids.map((id) => d.push(id));
    for (const p of pieces) expect(p).not.toContain('\uFFFD');
    expect(pieces.join('') + d.flush()).toBe(tok.decode(ids));
  });
});
