import type { TokenLogprob } from '../engine-api.js';

// When a decode run's tokens leave the worker. Each post wakes the main thread on
// the other core, and that wake is the worker's costliest work between two steps:
// ~0.1 ms of a ~1.6 ms step at one stream of m25 int4 on this 2-core VM, where
// feeds, the KV write and sampling take ~0.08 ms together (bench/README.md, "Token
// posts"), and the main thread's SSE write of what it carries wakes the client. A
// fast step's tokens are therefore held briefly and posted several steps at a time,
// as vLLM's `--stream-interval` does; a slow step (past TOKENS_POST_INTERVAL_MS)
// still posts every step.

/**
 * Steps' tokens are held at most this long (from the last post): at most a post a 60 Hz
 * display frame (16.7 ms), so a reader sees no difference; at one stream of m25 about
 * fifteen steps go in one post, of m110 about five. Each post costs the HTTP thread
 * 0.25 ms or more on this 2-core VM (its SSE write wakes the client), taken from the
 * model's cores. Against 3 ms, 10 read one stream of m25 int4 +4.6 % (9 of 10 alternated
 * pairs) and of m110 int4 +4.9 % (8 of 8; its 3.3 ms steps had posted one token each),
 * 16 streams of m25 int4 +0.3 to +7.6 %; 16 against 10 read one stream of m25 int4
 * +6.2 % (9 of 10), 16 streams +3.3 % (6 of 8), m110 even (0.994 twice)
 * (bench/README.md "Fewer token posts"). vLLM's `--stream-interval` counts tokens
 * instead; a time bound holds a slow step's tokens not at all.
 */
export const TOKENS_POST_INTERVAL_MS = 16;
/**
 * A sequence's first tokens go out with the step that made them: its time to first
 * text (a first character may need several byte tokens) is not held.
 */
export const TOKENS_POSTED_AT_ONCE = 4;

/** One step of a decode run: the token of each sequence that ran (logprobs[b]: row b's, when it asked). */
export interface StepTokens {
  seqs: number[];
  tokens: Int32Array;
  logprobs?: Array<TokenLogprob | null>;
  /**
   * When the worker sampled them, as `performance.timeOrigin + performance.now()`, a clock
   * every thread shares: a held token's inter-token latency is measured to when it was
   * made, not to when its post arrived.
   */
  madeAt: number;
  /** The step's own time, its sampling included, not the joins run before it: the model's pace (throughput.ts StepPace). */
  stepMs: number;
}

/** Now on the clock of StepTokens.madeAt. */
export const sharedNow = (): number => performance.timeOrigin + performance.now();

/** A decode run's steps not yet posted; `post` gets them in order, at least one step at a time. */
export class TokenPosts {
  private held: StepTokens[] = [];
  private lastPostAt = -Infinity;

  constructor(
    private readonly post: (steps: StepTokens[]) => void,
    private readonly intervalMs = TOKENS_POST_INTERVAL_MS,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /**
   * Holds a step's tokens, and posts what is held when the interval has passed or the
   * step is `urgent` (a sequence in it is young or has ended: its reader, or the
   * scheduler waiting for a free slot, should not wait).
   */
  add(step: StepTokens, urgent: boolean): void {
    this.held.push(step);
    if (urgent || this.now() - this.lastPostAt >= this.intervalMs) this.flush();
  }

  /** Posts what is held: before any other message of the worker, and when the run ends. */
  flush(): void {
    if (!this.held.length) return;
    const steps = this.held;
    this.held = [];
    this.lastPostAt = this.now();
    this.post(steps);
  }
}
