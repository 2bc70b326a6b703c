import { describe, expect, it } from 'vitest';
import { ApiError } from '../../errors.js';
import { parse } from '../../http/validate.js';
import { EvaluationRequest, IMAGE_BYTES_MAX } from '../protocol.js';
import { validateImages } from './images.js';
import { planEvaluation, type PlanEngine } from './evaluate.js';
import { distribution, needsTerminator, planBranches } from './score.js';
import { scoreTokens, sharedLead, type BranchSpec, type ServedModel } from '../engine-api.js';

const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const png = (bytes: number) => {
  const b = Buffer.alloc(bytes, 1);
  PNG.copy(b);
  return `data:image/png;base64,${b.toString('base64')}`;
};
const fails = (f: () => unknown) => {
  try {
    f();
  } catch (e) {
    return e as ApiError;
  }
  throw new Error('did not fail');
};

describe('evaluation request limits at their boundaries', () => {
  const q = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`q${i}`, { type: 'boolean' }]));
  it('64 questions pass and 65 fail', () => {
    expect(() => parse(EvaluationRequest, { state: 's', questions: q(64) })).not.toThrow();
    const e = fails(() => parse(EvaluationRequest, { state: 's', questions: q(65) }));
    expect(e.param).toBe('questions');
    expect(e.message).toContain('at most 64');
  });
  it('255 options pass and 256 fail', () => {
    const opts = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`o${i}`, null]));
    expect(() => parse(EvaluationRequest, { state: 's', questions: { c: { type: 'choice', criteria: opts(255) } } })).not.toThrow();
    const e = fails(() => parse(EvaluationRequest, { state: 's', questions: { c: { type: 'choice', criteria: opts(256) } } }));
    expect(e.param).toBe('questions.c.criteria');
    expect(e.message).toContain('at most 255');
  });
  it('10 criteria pass and 11 fail; 1 fails too', () => {
    const levels = (n: number) => Array.from({ length: n }, (_, i) => `level ${i}`);
    expect(() => parse(EvaluationRequest, { state: 's', questions: { s: { type: 'score', criteria: levels(10) } } })).not.toThrow();
    expect(fails(() => parse(EvaluationRequest, { state: 's', questions: { s: { type: 'score', criteria: levels(11) } } })).message).toContain('at most 10');
    expect(fails(() => parse(EvaluationRequest, { state: 's', questions: { s: { type: 'score', criteria: levels(1) } } })).message).toContain('at least 2');
  });
  it('question ids: 100 characters of the allowed set pass; 101 or other characters fail', () => {
    expect(() => parse(EvaluationRequest, { state: 1, questions: { ['a'.repeat(100)]: { type: 'boolean' } } })).not.toThrow();
    expect(fails(() => parse(EvaluationRequest, { state: 1, questions: { ['a'.repeat(101)]: { type: 'boolean' } } })).message).toContain('100');
    expect(fails(() => parse(EvaluationRequest, { state: 1, questions: { 'a b': { type: 'boolean' } } })).message).toContain('letters, digits');
  });
  it('boolean criteria take only true and false; type must be known; state is required', () => {
    expect(fails(() => parse(EvaluationRequest, { state: 1, questions: { b: { type: 'boolean', criteria: { maybe: 'x' } } } })).message).toContain('"true" and "false"');
    expect(fails(() => parse(EvaluationRequest, { state: 1, questions: { b: { type: 'rank' } } })).param).toBe('questions.b.type');
    expect(fails(() => parse(EvaluationRequest, { questions: { b: { type: 'boolean' } } })).param).toBe('state');
  });
});

describe('images', () => {
  it('an image of exactly 4 MiB passes and one byte more fails', () => {
    expect(validateImages([png(IMAGE_BYTES_MAX)])[0]).toEqual({ format: 'png', bytes: IMAGE_BYTES_MAX });
    expect(fails(() => validateImages([png(IMAGE_BYTES_MAX + 1)])).message).toContain(`${IMAGE_BYTES_MAX + 1} bytes`);
  });
  it('checks the bytes, not the declared type, and refuses remote URLs and more than 8 MiB together', () => {
    const jpeg = Buffer.from([0xff, 0xd8, 0xff, 0xe0, 1, 2, 3, 4]).toString('base64');
    expect(validateImages([`data:image/png;base64,${jpeg}`])[0]!.format).toBe('jpeg');
    const webp = Buffer.concat([Buffer.from('RIFF'), Buffer.alloc(4), Buffer.from('WEBPVP8 ')]).toString('base64');
    expect(validateImages([`data:image/webp;base64,${webp}`])[0]!.format).toBe('webp');
    const gif = Buffer.from('GIF89a......').toString('base64');
    expect(fails(() => validateImages([`data:image/png;base64,${gif}`])).message).toContain('not a PNG, JPEG or WebP');
    expect(fails(() => validateImages(['https://example.com/a.png'])).message).toContain('remote image URLs');
    const e = fails(() => validateImages([png(IMAGE_BYTES_MAX), png(IMAGE_BYTES_MAX), png(1000)]));
    expect(e.param).toBe('images');
  });
});

describe('trie scoring of multi-token answers', () => {
  it('shares prefixes between alternatives and adds the chain-rule log-probs', () => {
    const branches: BranchSpec[] = [];
    const paths = planBranches([9, 9], [[1, 2], [1, 3], [4]], branches);
    expect(branches).toEqual([
      { parent: -1, tokens: [9, 9] },
      { parent: 0, tokens: [1] },
    ]);
    expect(paths).toEqual([[[0, 1], [1, 2]], [[0, 1], [1, 3]], [[0, 4]]]);
    const lp = [new Float32Array([0, Math.log(0.5), 0, 0, Math.log(0.5)]), new Float32Array([0, 0, Math.log(0.25), Math.log(0.75), 0])];
    const d = distribution(paths, lp);
    expect(d[0]).toBeCloseTo(0.125, 6);
    expect(d[1]).toBeCloseTo(0.375, 6);
    expect(d[2]).toBeCloseTo(0.5, 6);
  });
  it("counts the questions' shared opening tokens once, each question keeping at least its last token", () => {
    const branches: BranchSpec[] = [];
    planBranches([5, 6, 7, 8], [[1], [2]], branches);
    planBranches([5, 6, 9], [[1, 2], [1, 3]], branches);
    // Roots [5, 6, 7, 8] and [5, 6, 9]; the second's answer-token branch [1] is no question.
    expect(sharedLead(branches)).toEqual([5, 6]);
    expect(scoreTokens(2, branches)).toBe(2 + 2 + 2 + 1 + 1);
    // One question, or no shared lead: nothing is shared.
    expect(sharedLead([{ parent: -1, tokens: [3, 4, 5] }])).toEqual([]);
    expect(scoreTokens(1, [{ parent: -1, tokens: [3, 4, 5] }])).toBe(4);
    expect(sharedLead([{ parent: -1, tokens: [3, 4] }, { parent: -1, tokens: [4, 4] }])).toEqual([]);
    // A question that is the others' lead itself keeps its one last token.
    expect(sharedLead([{ parent: -1, tokens: [3, 4] }, { parent: -1, tokens: [3, 4, 5] }])).toEqual([3]);
  });
  it('needs a terminator only when one answer is a prefix of another', () => {
    expect(needsTerminator([[1], [1, 2]])).toBe(true);
    expect(needsTerminator([[1, 3], [1, 2]])).toBe(false);
  });
});

describe('planEvaluation on a fake engine', () => {
  // Characters are tokens; log-probs are a fixed pseudo-random function of the branch.
  const engine: PlanEngine = {
    encode: async (_m, text) => [...text].map((c) => c.charCodeAt(0) % 256),
    bosTokens: () => [1],
    scoreBranches: async (_m, { prefixTokens, branches }) => ({
      processedTokens: scoreTokens(prefixTokens.length, branches),
      logprobs: branches.map((b, k) => {
        const logits = Float32Array.from({ length: 256 }, (_, i) => Math.sin(i * 12.9898 + k * 78.233 + (b.tokens[b.tokens.length - 1] ?? 0)) * 3);
        const max = Math.max(...logits);
        const z = Math.log(logits.reduce((s, x) => s + Math.exp(x - max), 0)) + max;
        return logits.map((x) => x - z);
      }),
    }),
  };
  const model: ServedModel = { id: 'm', kind: 'evaluation', contextLength: 4096, charsPerTokenMax: 1, maxTokensDefault: 1, maxTokensCap: 1, prices: { inputPerMTok: 1, outputPerMTok: 0 }, ownedBy: 'x', created: 0 };

  it('answers every type with distributions that sum to 1 and scores equal to their weighted mean', async () => {
    for (let seed = 0; seed < 20; seed++) {
      const nOpts = 1 + (seed % 7);
      const nLevels = 2 + (seed % 9);
      const req = parse(EvaluationRequest, {
        state: { seed, text: 'x'.repeat(seed) },
        questions: {
          b: { type: 'boolean', instructions: 'Is it?' },
          c: { type: 'choice', criteria: Object.fromEntries(Array.from({ length: nOpts }, (_, i) => [`opt${i}`, i % 2 ? null : `desc ${i}`])) },
          s: { type: 'score', criteria: Array.from({ length: nLevels }, (_, i) => `l${i}`) },
        },
      });
      const plan = await planEvaluation(engine, model, req);
      const out = await engine.scoreBranches('m', plan);
      const r = plan.finish(out.logprobs, out.processedTokens);
      expect(r.usage).toEqual({ inputTokens: plan.tokens, outputTokens: 0 });
      const b = r.answers.b!;
      expect(b.type === 'boolean' && b.probability >= 0 && b.probability <= 1).toBe(true);
      const c = r.answers.c!;
      if (c.type !== 'choice') throw new Error('type');
      const cp = Object.values(c.probabilities);
      expect(cp).toHaveLength(nOpts);
      expect(Math.abs(cp.reduce((a, x) => a + x, 0) - 1)).toBeLessThan(1e-9);
      expect(c.probabilities[c.choice]).toBe(Math.max(...cp));
      const s = r.answers.s!;
      if (s.type !== 'score') throw new Error('type');
      expect(Object.keys(s.probabilities)).toEqual(Array.from({ length: nLevels }, (_, i) => String(i)));
      const mean = Object.entries(s.probabilities).reduce((a, [k, p]) => a + Number(k) * p, 0);
      expect(Math.abs(mean - s.score)).toBeLessThan(1e-9);
      expect(s.score).toBeGreaterThanOrEqual(0);
      expect(s.score).toBeLessThanOrEqual(nLevels - 1);
    }
  });

  it('warns that images are unsupported on a text model and refuses a state over the context', async () => {
    const req = parse(EvaluationRequest, { state: 's', questions: { b: { type: 'boolean' } }, images: [png(100)] });
    expect((await planEvaluation(engine, model, req)).warnings).toEqual([{ type: 'unsupported', feature: 'images', details: expect.stringContaining('text only') }]);
    const big = parse(EvaluationRequest, { state: 'y'.repeat(5000), questions: { b: { type: 'boolean' } } });
    const e = await planEvaluation(engine, model, big).then(() => { throw new Error('accepted'); }, (x: ApiError) => x);
    expect(e.code).toBe('context_length_exceeded');
    expect(e.param).toBe('state');
  });

  it("counts two questions' shared lead once", async () => {
    const ask = (...qs: string[]) => parse(EvaluationRequest, { state: 's', questions: Object.fromEntries(qs.map((q, i) => [`q${i}`, { type: 'boolean', instructions: q }])) });
    const two = await planEvaluation(engine, model, ask('Is it red?', 'Is it blue?'));
    const one = await planEvaluation(engine, model, ask('Is it red?'));
    const chars = (t: number[]) => String.fromCharCode(...t);
    expect(chars(sharedLead(two.branches))).toBe(' Is it ');
    // The second question adds its own tokens and answers, not the lead again.
    const own = (p: typeof two) => p.branches.reduce((n, b) => n + b.tokens.length, 0);
    expect(two.tokens - one.tokens).toBe(own(two) - own(one) - ' Is it '.length);
  });

  it('still answers 255 options on a small context by listing fewer details', async () => {
    const small = { ...model, contextLength: 512 };
    const req = parse(EvaluationRequest, {
      state: 's',
      questions: { c: { type: 'choice', criteria: Object.fromEntries(Array.from({ length: 255 }, (_, i) => [`o${i}`, `a long description of option ${i}`])) } },
    });
    const plan = await planEvaluation(engine, small, req);
    const out = await engine.scoreBranches('m', plan);
    const c = plan.finish(out.logprobs, out.processedTokens).answers.c!;
    expect(c.type === 'choice' && Object.keys(c.probabilities).length).toBe(255);
  });
});
