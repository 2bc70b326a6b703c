import { endsGeneration, type SamplerSpec } from './protocol.js';
import type { Cuts, LogitAdjust, TokenLogprob } from '../engine-api.js';
import { adjustLogits, mulberry32, sample, tokenLogprob } from './sampler.js';
import { Matcher, TokenMasker, type Grammar, type State } from '../grammar/grammar.js';

// One generation's sampling state in the model worker: its settings, the counts its penalties
// read, its grammar's parse state, its budget and the token its next step feeds. Sampling next to
// the session lets a decode run go on step after step with no round trip to the main thread: on a
// 2-core machine the main thread is often not running when a step ends, and waiting for it cost a
// quarter of the worker's time. sampler.ts holds the arithmetic on one row of logits; this file
// the state a generation carries from one step to the next.

export interface Sampling {
  temperature: number;
  topP: number;
  cuts: Cuts | undefined;
  adjust: LogitAdjust | undefined;
  /** Generated tokens and their counts (presence / frequency penalties read them). */
  counts: Map<number, number>;
  /** The adjusted row, reused step after step. */
  scratch: Float32Array | undefined;
  /** Alternatives to report with each token's logprob; undefined: no logprobs. */
  topLogprobs: number | undefined;
  /** The last sampled token's logprob, when asked for. */
  lastLogprob: TokenLogprob | null;
  /** Structured output: the grammar's parse state, masking the logits at every step. */
  constraint: Constraint | undefined;
  rand: () => number;
  budget: number;
  /** Tokens sampled so far. */
  made: number;
  eos: Set<number>;
  /** The last sampled token: the input of the sequence's next decode step. */
  next: number;
  /** End of text or budget spent: no more steps. */
  ended: boolean;
  /** SamplerSpec.keep. */
  keep: boolean;
}

/** Distinct grammars whose vocabulary index stays built (one per schema in use, at most). */
export const MASKERS_MAX = 32;

/** One model's token masks by grammar, over its tokens' texts; the most recently used MASKERS_MAX kept. */
export class Maskers {
  private readonly byKey = new Map<string, TokenMasker>();
  constructor(private readonly tokenTexts: ReadonlyArray<string | null>) {}

  get(key: string, g: Grammar): TokenMasker {
    let m = this.byKey.get(key);
    if (m) {
      this.byKey.delete(key);
      this.byKey.set(key, m);
      return m;
    }
    m = new TokenMasker(new Matcher(g), this.tokenTexts);
    this.byKey.set(key, m);
    if (this.byKey.size > MASKERS_MAX) this.byKey.delete(this.byKey.keys().next().value!);
    return m;
  }

  /** A new generation's constraint to grammar `g` (by its key). */
  constraint(key: string, g: Grammar): Constraint {
    return new Constraint(this.get(key, g), this.tokenTexts);
  }
}

/**
 * A generation held to a grammar: before each draw every token that cannot continue the
 * document gets -Infinity (end of text only once the document is complete); after it the
 * parse state moves over the token's text. A dead end (no token fits) ends the generation.
 */
export class Constraint {
  private state: State;
  private readonly allowed: Uint8Array;
  constructor(
    private readonly masker: TokenMasker,
    private readonly tokenTexts: ReadonlyArray<string | null>,
  ) {
    this.state = masker.matcher.initial();
    this.allowed = new Uint8Array(tokenTexts.length);
  }

  apply(l: Float32Array, eos: ReadonlySet<number>): void {
    const eosLogits = [...eos].map((e) => [e, l[e]!] as const);
    const n = this.masker.mask(this.state, this.allowed);
    for (let t = 0; t < l.length; t++) if (!this.allowed[t]) l[t] = -Infinity;
    // End of text, at its own logit: when the document is complete, or when nothing else fits.
    if (this.state.accepting || n === 0) for (const [e, v] of eosLogits) l[e] = v;
  }

  accept(tok: number, eos: ReadonlySet<number>): void {
    if (eos.has(tok)) return;
    this.state = this.masker.matcher.advanceText(this.state, this.tokenTexts[tok] ?? '') ?? this.state;
  }
}

/** A generation's sampling state from its spec; a grammar's masks come from `maskers`. */
export function startSampling(spec: SamplerSpec, maskers: Maskers): Sampling {
  return {
    temperature: spec.temperature,
    topP: spec.topP,
    cuts: spec.cuts,
    adjust: spec.adjust,
    counts: new Map(),
    scratch: undefined,
    topLogprobs: spec.topLogprobs,
    lastLogprob: null,
    constraint: spec.grammar ? maskers.constraint(spec.grammar.key, spec.grammar.grammar) : undefined,
    rand: mulberry32(spec.seed),
    keep: spec.keep === true,
    budget: spec.budget,
    made: 0,
    eos: new Set(spec.eos),
    next: -1,
    ended: false,
  };
}

/** Samples row `row` of `logits` (rows of `V` last-position logits) for generation `sm`, and moves it on by that token. */
export function draw(sm: Sampling, logits: Float32Array, row: number, V: number): number {
  let l = logits;
  let off = row * V;
  if (sm.adjust) {
    l = adjustLogits(logits, off, V, sm.adjust, sm.counts, (sm.scratch ??= new Float32Array(V)));
    off = 0;
  }
  if (sm.constraint) {
    if (l === logits) {
      l = (sm.scratch ??= new Float32Array(V));
      l.set(logits.subarray(off, off + V));
      off = 0;
    }
    sm.constraint.apply(l, sm.eos);
  }
  const tok = sample(l, off, V, sm.temperature, sm.topP, sm.rand, sm.cuts);
  sm.constraint?.accept(tok, sm.eos);
  if (sm.topLogprobs !== undefined) sm.lastLogprob = tokenLogprob(logits, row * V, V, tok, sm.topLogprobs);
  if (sm.adjust) sm.counts.set(tok, (sm.counts.get(tok) ?? 0) + 1);
  sm.next = tok;
  sm.made++;
  sm.ended = endsGeneration(tok, sm.made, sm.budget, sm.eos);
  return tok;
}
