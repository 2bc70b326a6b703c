// Which of a model's two sessions runs a step: the one on every core ("wide") or
// a one-thread session of the same graph ("narrow"). A step of a few tokens on a
// small model is a few hundred operators of microseconds each, and waking the
// other intra-op threads for each of them costs more than they save: m25 int4 at
// batch 1 steps in 1.30 ms on one thread and 2.03 ms on two, while 16 rows take
// 9.9 ms on one and 8.3 ms on two (bench/README.md "One thread for narrow steps").
// Where the crossing lies depends on the model and the machine (m110 int8 is
// faster on two threads at batch 1), so it is measured as the steps run.

export type SessionKind = 'narrow' | 'wide';

/**
 * Steps of more tokens than this always run wide: one thread pays off only for the smallest
 * (decode steps of a few rows, a short prompt: m25 int4's 20-token prompt took 14.1 ms on one
 * thread and 19.3 on two in one run, and as long in another), and trying a long prompt on one
 * thread would cost more than it could save.
 */
export const NARROW_STEP_TOKENS_MAX = 32;
/** Samples per session and size before the faster one is trusted (each session's first run is not counted: it allocates). */
const SAMPLES_TO_TRUST = 4;
/** How often the slower session is tried again for a size, in steps of that size: an estimate must follow the load. */
const RETRY_SLOWER_EVERY_STEPS = 64;
/**
 * A session's step time for a size is the fastest of its last this many runs. Runs are made
 * slow, never fast, by what is not the session's own doing: a new input shape (onnxruntime
 * plans its memory per shape), a pre-empted thread, a cold cache. A running mean carried such
 * runs for hundreds of steps and held a size on the slower session (m25 int4's one stream ran
 * on two threads at 2.4 ms a step when one thread took 1.6).
 */
const RECENT_RUNS = 8;
/**
 * How much faster the other session must have become before a size changes sessions: the
 * daemon's steps share the cores with the HTTP thread, and without a margin two sessions
 * within that noise of each other took turns for long stretches.
 */
const SWITCH_MARGIN = 0.1;

interface Bucket {
  narrow: Estimate;
  wide: Estimate;
  /** The session it runs on once both are measured. */
  current: SessionKind | undefined;
  /** Steps since the other session was last tried. */
  sinceRetry: number;
}

interface Estimate {
  /** Runs seen, the uncounted first included. */
  runs: number;
  /** The last RECENT_RUNS run times, oldest first. */
  recent: number[];
}

function fastestMs(e: Estimate): number {
  return Math.min(...e.recent);
}

/** Step sizes in buckets of powers of two: 1, 2, 3-4, 5-8, ... 17-32 tokens. */
function bucketOf(tokens: number): number {
  return Math.ceil(Math.log2(Math.max(1, tokens)));
}

export class SessionChoice {
  private readonly est = new Map<number, Bucket>();

  private of(bucket: number): Bucket {
    let e = this.est.get(bucket);
    if (!e) this.est.set(bucket, (e = { narrow: { runs: 0, recent: [] }, wide: { runs: 0, recent: [] }, current: undefined, sinceRetry: 0 }));
    return e;
  }

  /** The bucket's session now: once both are measured, the faster, changed only past the margin. */
  private current(e: Bucket): SessionKind | undefined {
    if (e.narrow.runs <= SAMPLES_TO_TRUST || e.wide.runs <= SAMPLES_TO_TRUST) return undefined;
    const ms = { narrow: fastestMs(e.narrow), wide: fastestMs(e.wide) };
    const faster: SessionKind = ms.narrow <= ms.wide ? 'narrow' : 'wide';
    const other: SessionKind = faster === 'narrow' ? 'wide' : 'narrow';
    if (e.current === undefined || ms[faster] < ms[other] * (1 - SWITCH_MARGIN)) e.current = faster;
    return e.current;
  }

  /** The session a step of `tokens` tokens (rows x new tokens) should run on. */
  pick(tokens: number): SessionKind {
    if (tokens > NARROW_STEP_TOKENS_MAX) return 'wide';
    const e = this.of(bucketOf(tokens));
    const now = this.current(e);
    // Until both are known, alternate between them (the one with fewer runs goes next).
    if (now === undefined) return e.narrow.runs <= e.wide.runs ? 'narrow' : 'wide';
    e.sinceRetry = (e.sinceRetry + 1) % RETRY_SLOWER_EVERY_STEPS;
    if (e.sinceRetry === 0) return now === 'narrow' ? 'wide' : 'narrow';
    return now;
  }

  /** Counts a step's run time into its session's estimate for its size. */
  record(tokens: number, kind: SessionKind, ms: number): void {
    if (tokens > NARROW_STEP_TOKENS_MAX) return;
    const s = this.of(bucketOf(tokens))[kind];
    s.runs++;
    if (s.runs === 1) return;
    s.recent.push(ms);
    if (s.recent.length > RECENT_RUNS) s.recent.shift();
  }

  /** Runs a step of `tokens` tokens on the session picked for its size (`on` runs it there) and counts its time. */
  async run<T>(tokens: number, on: (kind: SessionKind) => Promise<T>): Promise<{ out: T; kind: SessionKind }> {
    const kind = this.pick(tokens);
    const t0 = performance.now();
    const out = await on(kind);
    this.record(tokens, kind, performance.now() - t0);
    return { out, kind };
  }

  /** The session steps of this size run on now (tests, logs): undefined while still measuring. */
  chosen(tokens: number): SessionKind | undefined {
    if (tokens > NARROW_STEP_TOKENS_MAX) return 'wide';
    return this.current(this.of(bucketOf(tokens)));
  }
}
