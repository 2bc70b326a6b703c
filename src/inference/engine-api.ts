import { ApiError } from '../errors.js';

// What the HTTP side of inference needs from the engine; src/inference/engine implements it.

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
  grammar?: { key: string; grammar: import('./grammar/grammar.js').Grammar };
  stop: string[];
  signal?: AbortSignal;
  /**
   * Called exactly once when the sequence ends (finished, cancelled or failed)
   * with the tokens really run: billing uses this, not what a client read.
   */
  onEnd?: (usage: { promptTokens: number; completionTokens: number }) => void;
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
      promptTokens: number;
      completionTokens: number;
      failure?: EngineFailure;
    };

/** Why the engine ended a sequence it could not finish; `retryable`: the model is coming back (a restarted worker). */
export interface EngineFailure {
  message: string;
  retryable: boolean;
}

/** How long a client is asked to wait after a retryable failure: about a worker's restart (a model load). */
const ENGINE_RETRY_AFTER_MS = 2_000;

/** A failure as the API reports it: 503 with Retry-After while the model comes back, else 500. */
export const engineError = (f: EngineFailure): ApiError =>
  f.retryable
    ? new ApiError('unavailable', f.message, { code: 'engine_restarting', retryAfterMs: ENGINE_RETRY_AFTER_MS })
    : new ApiError('internal', f.message, { code: 'engine_failed' });

/** A scored branch: it continues the shared prefix (parent -1) or an earlier branch. */
export interface BranchSpec {
  parent: number;
  tokens: number[];
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
