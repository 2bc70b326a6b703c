import { ApiError } from '../../errors.js';
import { commonPrefix, scoreTokens, type BranchSpec, type InferenceEngine, type ServedModel, type TokenUsage } from '../engine-api.js';
import type { Answer, EvaluationRequest, Question, Warning } from '../protocol.js';
import { validateImages } from './images.js';
import { BOOLEAN_WORDS, planQuestion, prefixText, QUESTION_LEAD, type Detail } from './prompt.js';
import { distribution, needsTerminator, planBranches } from './score.js';

/** What planning an evaluation needs of the engine port: its tokenizer, no model work. */
export type PlanEngine = Pick<InferenceEngine, 'encode' | 'bosTokens'>;

export interface EvaluationResult {
  answers: Record<string, Answer>;
  usage: TokenUsage;
  warnings: Warning[];
}

interface Planned {
  id: string;
  question: Question;
  keys: string[];
  /** Per rotation: each alternative's scoring path. */
  rotations: Array<Array<Array<[number, number]>>>;
}

const ANSWER_LEAD = 'A:';
const DETAILS: Detail[] = ['full', 'names', 'none'];

/**
 * Tokens of each text as it continues `lead`: encoded together and cut where
 * they part from the lead's own tokens, so that a leading space, say, joins
 * the first word as it would in running text.
 */
async function continuations(encode: Encode, lead: string, texts: string[]): Promise<number[][]> {
  const base = await encode(lead);
  const full: number[][] = [];
  for (const t of texts) full.push(await encode(lead + t));
  const cut = Math.min(commonPrefix([base, ...full]), base.length);
  return full.map((f) => f.slice(cut));
}

/** Tokens of each answer as it continues `A:`; see score.ts for why terminators. */
async function answerTokens(encode: Encode, texts: string[]): Promise<number[][]> {
  const plain = await continuations(encode, ANSWER_LEAD, texts.map((t) => ` ${t}`));
  return needsTerminator(plain) ? continuations(encode, ANSWER_LEAD, texts.map((t) => ` ${t}\n`)) : plain;
}

type Encode = (text: string) => Promise<number[]>;

/** The model's encoder, remembering within one request: every boolean question shares its answers' tokens. */
function memoEncoder(engine: PlanEngine, modelId: string): Encode {
  const seen = new Map<string, Promise<number[]>>();
  return (text) => {
    let t = seen.get(text);
    if (!t) seen.set(text, (t = engine.encode(modelId, text)));
    // Shared, not copied: every caller slices or spreads what it keeps.
    return t;
  };
}

/**
 * Refuses a state that cannot fit before it is tokenised: no token stands for more than
 * `charsPerTokenMax` characters (the screening thread applies the same rule to large bodies).
 */
export function checkStateChars(model: ServedModel, prefix: string): void {
  const tokensMin = Math.ceil(prefix.length / model.charsPerTokenMax);
  if (tokensMin >= model.contextLength) throw stateTooLong(model, `${prefix.length} characters, at least ${tokensMin} tokens`);
}

const stateTooLong = (model: ServedModel, size: string) =>
  new ApiError('invalid', `the state takes ${size}; model ${model.id} reads at most ${model.contextLength} tokens in all`, { param: 'state', code: 'context_length_exceeded' });

export interface EvaluationPlan {
  prefixTokens: number[];
  branches: BranchSpec[];
  /** Tokens the engine will run, as billed: the prefix and the questions' shared lead once, every branch's own (scoreTokens). */
  tokens: number;
  warnings: Warning[];
  finish(logprobs: Float32Array[], processedTokens: number): EvaluationResult;
}

/**
 * Validates images, tokenises the state and every question (long texts off the
 * event loop), and lays out the branches. No model work.
 */
export async function planEvaluation(engine: PlanEngine, model: ServedModel, req: EvaluationRequest): Promise<EvaluationPlan> {
  const warnings: Warning[] = [];
  if (req.images?.length) {
    validateImages(req.images);
    warnings.push({ type: 'unsupported', feature: 'images', details: `model ${model.id} reads text only; the ${req.images.length} image(s) were not used` });
  }
  const prefix = prefixText(req.state);
  // No token stands for more than charsPerTokenMax characters: a state too long by that
  // bound is refused before the tokenizer spends seconds on it.
  checkStateChars(model, prefix);
  const prefixTokens = [...engine.bosTokens(model.id), ...(await engine.encode(model.id, prefix))];
  if (prefixTokens.length >= model.contextLength) throw stateTooLong(model, `${prefixTokens.length} tokens`);
  const room = model.contextLength - prefixTokens.length;
  // Single-token yes/no words keep a boolean question to one branch.
  const encode = memoEncoder(engine, model.id);
  let booleanWords = BOOLEAN_WORDS[0]!;
  for (const w of BOOLEAN_WORDS) {
    if ((await answerTokens(encode, w)).every((t) => t.length === 1)) {
      booleanWords = w;
      break;
    }
  }
  const branches: BranchSpec[] = [];
  const planned: Planned[] = [];
  for (const [id, question] of Object.entries(req.questions)) {
    let done = false;
    for (const detail of DETAILS) {
      const plan = planQuestion(question, detail, booleanWords);
      if (Math.max(...plan.texts.map((t) => t.length)) > room * model.charsPerTokenMax) continue;
      const alts = await answerTokens(encode, plan.alternatives.map((a) => a.text));
      const longestAlt = Math.max(...alts.map((a) => a.length));
      const qTokens = await continuations(encode, QUESTION_LEAD, plan.texts);
      if (Math.max(...qTokens.map((q) => q.length)) + longestAlt > room) continue;
      planned.push({ id, question, keys: plan.alternatives.map((a) => a.key), rotations: qTokens.map((q) => planBranches(q, alts, branches)) });
      done = true;
      break;
    }
    if (!done) {
      throw new ApiError('invalid', `question ${JSON.stringify(id)} does not fit model ${model.id}'s context of ${model.contextLength} tokens after the state`, {
        param: `questions.${id}`,
        code: 'context_length_exceeded',
      });
    }
  }
  return {
    prefixTokens,
    branches,
    tokens: scoreTokens(prefixTokens.length, branches),
    warnings,
    finish: (logprobs, processedTokens) => {
      const answers: Record<string, Answer> = {};
      for (const p of planned) {
        const dists = p.rotations.map((paths) => distribution(paths, logprobs));
        const probs = p.keys.map((_, k) => dists.reduce((s, d) => s + d[k]!, 0) / dists.length);
        answers[p.id] = toAnswer(p.question, p.keys, probs);
      }
      return { answers, usage: { inputTokens: processedTokens, outputTokens: 0 }, warnings };
    },
  };
}

function toAnswer(q: Question, keys: string[], probs: number[]): Answer {
  const total = probs.reduce((a, b) => a + b, 0);
  const p = probs.map((x) => x / total);
  switch (q.type) {
    case 'boolean':
      return { type: 'boolean', probability: p[keys.indexOf('true')]! };
    case 'score': {
      const probabilities = Object.fromEntries(keys.map((k, i) => [k, p[i]!]));
      const score = p.reduce((s, x, i) => s + i * x, 0);
      return { type: 'score', score: Math.min(Math.max(score, 0), keys.length - 1), probabilities };
    }
    case 'choice': {
      // Highest probability wins; ties go to the option listed first in the request.
      let best = 0;
      for (let i = 1; i < p.length; i++) if (p[i]! > p[best]!) best = i;
      return { type: 'choice', choice: keys[best]!, probabilities: Object.fromEntries(keys.map((k, i) => [k, p[i]!])) };
    }
  }
}
