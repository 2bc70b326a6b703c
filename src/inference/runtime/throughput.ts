// How fast a model runs while it has work, so that admission can say how long a
// new request would wait (issue 12.6: admission used to count requests, and admitted
// requests waited 53-60 s while their clients gave up).

/** The average forgets a step's rate over this much busy time: a few seconds of load. */
const RATE_WINDOW_MS = 2_000;

/** Tokens run per second of busy time (prompt and generated together), a time-weighted moving average. */
export class Throughput {
  private tokensPerS = 0;
  private tokens = 0;

  /** Tokens run since the last step was timed. */
  note(n: number): void {
    this.tokens += n;
  }

  /** A step (or decode run) took `ms` of busy time; the tokens noted since belong to it. */
  step(ms: number): void {
    if (ms <= 0 || this.tokens === 0) return;
    const r = (this.tokens * 1000) / ms;
    this.tokens = 0;
    const w = 1 - Math.exp(-ms / RATE_WINDOW_MS);
    this.tokensPerS = this.tokensPerS === 0 ? r : this.tokensPerS + w * (r - this.tokensPerS);
  }

  /** 0 until a step was measured. */
  get rate(): number {
    return this.tokensPerS;
  }
}
