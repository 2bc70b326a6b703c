// How far a weight variant's answers follow f32's: the measurement behind the
// quality table of models/README.md (bench/quantization.ts) and its test.
import fs from 'node:fs';
import path from 'node:path';
import { planEvaluation } from '../evaluator/evaluate.js';
import type { EvaluationRequest } from '../protocol.js';
import type { Engine } from '../runtime/engine.js';
import { prepareLlama2c } from './convert.js';
import { writeModelDir } from './model-config.js';

/**
 * stories260K (from `storiesDir`) as two folders under `dir`, `chat` and `evaluation` (ids
 * `s/chat`, `s/evaluation`), each with its f32, int8 and int4 variants: what the variant and
 * provider comparisons serve.
 */
export function writeStoriesVariants(dir: string, storiesDir: string): void {
  const ck = fs.readFileSync(path.join(storiesDir, 'stories260K.bin'));
  const tok = fs.readFileSync(path.join(storiesDir, 'tok512.bin'));
  for (const kind of ['chat', 'evaluation'] as const) writeModelDir(path.join(dir, kind), prepareLlama2c(ck, tok, { id: `s/${kind}`, kind, weights: ['f32', 'int8', 'int4'] }));
}

/** Greedy tokens compared (the and the peer harness's measure). */
export const GREEDY_TOKENS_COMPARED = 40;

/** The evaluation bench's state and questions (bench/evaluation.ts): 64 yes/no questions on a short story. */
export const BENCH_STATE =
  ('Lily was a little girl who loved to play in the park. One day she saw a big red ball under a tree. She ran to the ball and kicked it high into the sky. ' +
    'Her friend Tom laughed and clapped his hands. They played together until the sun went down, and then they walked home, tired and happy. ').repeat(2);
const SUBJECTS = ['Lily', 'Tom', 'the ball', 'the tree', 'the park', 'the sun', 'the sky', 'the girl'];
const TRAITS = ['happy', 'sad', 'red', 'big', 'tired', 'little', 'loud', 'kind'];
export function benchQuestions(n: number): EvaluationRequest['questions'] {
  return Object.fromEntries(Array.from({ length: n }, (_, i) => [`q${i}`, { type: 'boolean' as const, instructions: `Is ${SUBJECTS[i % 8]} ${TRAITS[Math.floor(i / 8) % 8]}?` }]));
}

/** The first `n` greedy tokens after BOS + `prompt` (fewer when the model ends the text). */
export async function greedyTokens(engine: Engine, model: string, prompt: string, n = GREEDY_TOKENS_COMPARED): Promise<number[]> {
  const ids: number[] = [];
  const promptTokens = await engine.encodeText(model, prompt, true);
  for await (const ev of engine.generate(model, { promptTokens, maxTokens: n, temperature: 0, topP: 1, stop: [] })) {
    if (ev.type === 'delta') ids.push(...ev.tokenIds);
  }
  return ids;
}

/** How many leading positions of `a` equal `b` (the first difference ends the match: the texts then diverge). */
export function leadingAgreement(a: number[], b: number[]): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

/** Every question's probability of "yes" on the evaluation bench's state, as POST /api/v1/evaluations answers it. */
export async function evaluationProbabilities(engine: Engine, model: string, questions = benchQuestions(64)): Promise<Record<string, number>> {
  const info = engine.model(model);
  if (!info) throw new Error(`model ${model} is not loaded`);
  const plan = await planEvaluation(engine, info, { model, state: BENCH_STATE, questions });
  const out = await engine.scoreBranches(model, { prefixTokens: plan.prefixTokens, branches: plan.branches });
  const { answers } = plan.finish(out.logprobs, out.processedTokens);
  return Object.fromEntries(Object.entries(answers).map(([id, a]) => [id, a.type === 'boolean' ? a.probability : NaN]));
}

export function largestChange(a: Record<string, number>, b: Record<string, number>): number {
  return Math.max(...Object.keys(a).map((k) => Math.abs(a[k]! - b[k]!)));
}

/** Alternatives read at each forced position: enough to find the reference's token in all but flat distributions. */
const FORCED_TOP_LOGPROBS = 20;

/**
 * Teacher-forced agreement: after BOS + `prompt` + each prefix of `reference` (f32's greedy
 * tokens), whether the variant's most likely next token is reference's, and the probability it
 * gives reference's token: one entry per position. That probability is a lower bound: 0 when
 * the token is outside the variant's top FORCED_TOP_LOGPROBS, or when the variant's most likely
 * token ends the text (the engine reports no token then). Unlike the leading agreement, one
 * early difference does not decide every later position: each is judged on the same text.
 */
export async function forcedAgreement(engine: Engine, model: string, prompt: string, reference: number[]): Promise<{ agree: number; probs: number[] }> {
  const promptTokens = await engine.encodeText(model, prompt, true);
  let agree = 0;
  const probs: number[] = [];
  for (let i = 0; i < reference.length; i++) {
    let prob = 0;
    for await (const ev of engine.generate(model, { promptTokens: [...promptTokens, ...reference.slice(0, i)], maxTokens: 1, temperature: 0, topP: 1, stop: [], topLogprobs: FORCED_TOP_LOGPROBS })) {
      if (ev.type === 'done') {
        if (ev.finishReason === 'failed' || ev.finishReason === 'cancelled') throw new Error(`forcedAgreement: ${model} ${ev.finishReason} at position ${i} of ${JSON.stringify(prompt)}: ${ev.failure?.message ?? 'no failure given'}`);
        continue;
      }
      if (ev.tokenIds.length === 0) continue;
      if (ev.tokenIds[0] === reference[i]) agree++;
      const hit = ev.logprobs?.[0]?.top.find(([id]) => id === reference[i]);
      if (hit) prob = Math.exp(hit[1]);
    }
    probs.push(prob);
  }
  return { agree, probs };
}

/** The mean absolute difference of two equally long lists (0 for empty ones). */
export function meanChange(a: number[], b: number[]): number {
  if (a.length !== b.length) throw new Error(`meanChange: ${a.length} values against ${b.length}`);
  return a.length ? a.reduce((s, v, i) => s + Math.abs(v - b[i]!), 0) / a.length : 0;
}
