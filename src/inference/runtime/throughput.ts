// How fast a model runs while it has work, so that admission can say how long a
// new request would wait (issue 12.6: admission used to count requests, and admitted
// requests waited 53-60 s while their clients gave up).

/** The average forgets a step's rate over this much busy time: a few seconds of load. */
const RATE_WINDOW_MS = 2_000;

/**
 * Tokens run per second of busy time (prompt and generated together): decayed sums of
 * tokens and of time, so that each step counts by its length (a 1 ms prefill of 15
 * tokens must not set the rate for the decode steps after it).
 */
export class Throughput {
  private tokensSum = 0;
  private msSum = 0;
  private tokens = 0;

  /** Tokens run since the last step was timed. */
  note(n: number): void {
    this.tokens += n;
  }

  /** A step (or decode run) took `ms` of busy time; the tokens noted since belong to it. */
  step(ms: number): void {
    if (ms <= 0) return;
    const keep = Math.exp(-ms / RATE_WINDOW_MS);
    this.tokensSum = this.tokensSum * keep + this.tokens;
    this.msSum = this.msSum * keep + ms;
    this.tokens = 0;
  }

  /** 0 until a step was measured. */
  get rate(): number {
    return this.msSum > 0 ? (this.tokensSum * 1000) / this.msSum : 0;
  }
}

/** Completions are counted over about this much recent time: several request lengths. */
const COMPLETION_WINDOW_MS = 10_000;
/** Endings (decayed) needed before the rate says anything: one short request is no pace. */
const COMPLETIONS_MEASURED_MIN = 4;

/**
 * How often batch slots free up (requests ending), per second, over the recent past.
 * A request that would queue behind k others waits about k / rate for its slot: this
 * measures what waiting costs directly, where a tokens-per-second rate does not carry
 * over between batch sizes and positions (a token at position 460 of a full batch cost
 * ~16x one at 160; a rate taken early promised waits 3-4x too short).
 */
export class CompletionRate {
  private count = 0;
  private ms = 0;
  private last = performance.now();

  private advance(now: number): void {
    const dt = now - this.last;
    this.last = now;
    const keep = Math.exp(-dt / COMPLETION_WINDOW_MS);
    this.count *= keep;
    this.ms = this.ms * keep + dt;
  }

  /** A request ended and gave its slot back. */
  note(now = performance.now()): void {
    this.advance(now);
    this.count += 1;
  }

  /** Slots freed per second; undefined while too few requests ended lately to tell. */
  perSecond(now = performance.now()): number | undefined {
    this.advance(now);
    return this.count >= COMPLETIONS_MEASURED_MIN && this.ms > 0 ? (this.count * 1000) / this.ms : undefined;
  }
}
