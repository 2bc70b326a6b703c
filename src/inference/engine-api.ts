import type { Grammar } from './grammar/grammar.js';

// The engine port: what the HTTP side of inference needs from the engine, in one interface
// that src/inference/runtime/engine.ts implements. The engine never speaks HTTP: it yields
// tokens and plain failures; the serving files turn them into API answers and errors.

/** The one port. Serving code that needs part of it takes a `Pick` of it (tests fake that part). */
export interface InferenceEngine {
  list(): ServedModel[];
  model(id: string): ServedModel | undefined;
  /** A chat rendered by the model's template and tokenised (with its special tokens). */
  encodeChat(modelId: string, messages: ChatMessage[]): Promise<number[]>;
  encodeText(modelId: string, text: string, addSpecialTokens: boolean): Promise<number[]>;
  /** A text without special tokens (an evaluation's pieces). */
  encode(modelId: string, text: string): Promise<number[]>;
  bosTokens(modelId: string): number[];
  decode(modelId: string, ids: number[]): string;
  tokenStrings(modelId: string, ids: number[]): string[];
  tokenBytes(modelId: string, id: number): Uint8Array;
  generate(modelId: string, req: GenerateRequest): AsyncGenerator<GenerateEvent>;
  /** Log-probabilities of each branch's tokens after a shared prefix (evaluations). */
  scoreBranches(modelId: string, req: ScoreRequest): Promise<ScoreResult>;
}

/** Tokens a request ran, as billed: the one usage shape inside the daemon (each API's wire shape is made from it where it is sent). */
export interface TokenUsage {
  inputTokens: number;
  outputTokens: number;
  /** Of inputTokens, those a generation took from a kept cache instead of running them (runtime/kept-prompts.ts); billed all the same. */
  cachedInputTokens?: number;
}

export interface ScoreRequest {
  prefixTokens: number[];
  branches: BranchSpec[];
  signal?: AbortSignal;
  /**
   * Requests of one scope (the caller's user) whose identical prefix is still prefilling share
   * that prefill; none is shared across scopes, so one tenant's timing tells nothing of another's.
   */
  shareScope?: string;
}

export interface ScoreResult {
  /** Per branch, the log-probability of each of its tokens. */
  logprobs: Float32Array[];
  /** Tokens the request runs as if alone (scoreTokens), as billed: a prefix another request's prefill served counts too. */
  processedTokens: number;
}

export interface ChatMessage {
  role: string;
  content: string;
}

export interface ServedModel {
  id: string;
  kind: 'chat' | 'evaluation';
  contextLength: number;
  /** The most characters one token stands for: a longer text than contextLength of these is refused untokenised. */
  charsPerTokenMax: number;
  /** Token ids run from 0 to vocabSize - 1 (logit_bias keys are checked against it). */
  vocabSize: number;
  /** Whether its tokens' texts are known, so output can be constrained to a grammar. */
  structuredOutput: boolean;
  maxTokensDefault: number;
  maxTokensCap: number;
  prices: { inputPerMTok: number; outputPerMTok: number };
  ownedBy: string;
  created: number;
}

export interface GenerateRequest {
  promptTokens: number[];
  maxTokens: number;
  temperature: number;
  topP: number;
  seed?: number;
  /** top_k / min_p (vLLM's extras); absent: no cut. */
  cuts?: Cuts;
  /** logit_bias and presence / frequency penalties; absent: the raw logits. */
  adjust?: LogitAdjust;
  /** Report each token's log-probability and this many alternatives (0-20); absent: none. */
  topLogprobs?: number;
  /** Structured output: sample only tokens that keep the text in this grammar (`key` names it for caches). */
  grammar?: { key: string; grammar: Grammar };
  stop: string[];
  signal?: AbortSignal;
  /**
   * Whose request this is (the user): a later prompt of the same scope that opens with this one's
   * tokens starts from its kept cache (runtime/kept-prompts.ts); none of another scope's does.
   * Absent: nothing kept, nothing found.
   */
  shareScope?: string;
  /**
   * Called exactly once when the sequence ends (finished, cancelled or failed)
   * with the tokens really run: billing uses this, not what a client read.
   */
  onEnd?: (usage: TokenUsage) => void;
}

/** A generated token's log-probability under the model, and the most likely alternatives. */
export interface TokenLogprob {
  logprob: number;
  /** [token id, logprob] of the `topLogprobs` most likely tokens, most likely first. */
  top: Array<[number, number]>;
}

export type GenerateEvent =
  /** `logprobs[i]` belongs to `tokenIds[i]`, present when the request asked for them. */
  | { type: 'delta'; text: string; tokenIds: number[]; logprobs?: TokenLogprob[] }
  | {
      type: 'done';
      /**
       * `cancelled`: the reader went away or its deadline passed (the request's signal says which);
       * `failed`: the engine could not go on (a step failed, the worker died): `failure` says why.
       */
      finishReason: 'stop' | 'length' | 'cancelled' | 'failed';
      usage: TokenUsage;
      failure?: EngineFailure;
    };

/**
 * Why the engine ended a sequence it could not finish; `retryable`: the model is coming back (a
 * restarted worker) or is served elsewhere; `shuttingDown`: the engine was closed under it.
 */
export interface EngineFailure {
  message: string;
  retryable: boolean;
  shuttingDown?: true;
}

/** The engine would not take the work now: the model is down, or it could not start in time. */
export class EngineRefused extends Error {
  constructor(
    message: string,
    /** `model_down`: its worker kept dying; `queue_full`: its queue is at its limit; `busy`: it would not start within ADMISSION_WAIT_MS_MAX. */
    readonly reason: 'model_down' | 'queue_full' | 'busy',
    /** When to come back, where the engine can say. */
    readonly retryAfterMs?: number,
  ) {
    super(message);
    this.name = 'EngineRefused';
  }
}

/** The engine could not finish work it had taken (a step failed, the worker died). */
export class EngineFailed extends Error {
  constructor(readonly failure: EngineFailure) {
    super(failure.message);
    this.name = 'EngineFailed';
  }
}

/** The model's chat template raised an error on these messages (its own rule, such as roles that must alternate). */
export class TemplateRefused extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TemplateRefused';
  }
}

/** A scored branch: it continues the shared prefix (parent -1) or an earlier branch. */
export interface BranchSpec {
  parent: number;
  tokens: number[];
}

/**
 * The opening tokens every question (root branch) shares, each keeping at least its last token,
 * whose distribution it is scored on: the engine runs them once, after the prefix, instead of once
 * a question ("Is Lily happy?", "Is Tom kind?"). None for a lone question: nothing is shared.
 */
export function sharedLead(branches: BranchSpec[]): number[] {
  const roots = branches.filter((b) => b.parent === -1).map((b) => b.tokens);
  if (roots.length < 2) return [];
  return roots[0]!.slice(0, Math.min(commonPrefix(roots), ...roots.map((t) => t.length - 1)));
}

/** Longest common prefix length of token sequences. */
export function commonPrefix(seqs: number[][]): number {
  if (seqs.length === 0) return 0;
  let n = Math.min(...seqs.map((s) => s.length));
  const first = seqs[0]!;
  for (const s of seqs) {
    let i = 0;
    while (i < n && s[i] === first[i]) i++;
    n = i;
  }
  return n;
}

/**
 * Tokens a score request runs, and is billed, as if it ran alone: the prefix and the questions'
 * shared lead once, then every branch's own tokens. A request that joins another's prefill
 * (scheduler.ts) is billed the same. `lead`: sharedLead(branches), where the caller has it.
 */
export function scoreTokens(prefixLength: number, branches: BranchSpec[], lead = sharedLead(branches)): number {
  const roots = branches.filter((b) => b.parent === -1).length;
  return prefixLength + branches.reduce((n, b) => n + b.tokens.length, 0) - Math.max(roots - 1, 0) * lead.length;
}

/** Cuts beyond temperature and top_p (vLLM's extras): 0 turns each off. */
export interface Cuts {
  /** Keep only the k most likely tokens. */
  topK: number;
  /** Drop tokens less likely than minP times the most likely one's probability. */
  minP: number;
}

/**
 * What OpenAI's API adds to the raw logits before sampling: `logit_bias` per token
 * id, and presence / frequency penalties over the tokens generated so far.
 */
export interface LogitAdjust {
  bias: ReadonlyArray<readonly [number, number]>;
  presence: number;
  frequency: number;
}
