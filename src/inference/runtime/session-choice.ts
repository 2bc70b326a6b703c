// Which of a model's sessions runs a step: the one on every core whose threads sleep
// between operators ("wide"), a one-thread session of the same graph ("narrow"), or one
// on every core whose threads spin while a run lasts ("spinning"). A step of a few tokens
// on a small model is a few hundred operators of microseconds each: waking sleeping
// threads for each of them costs more than they save (m25 int4 at batch 1: 1.30 ms on one
// thread, 2.03 ms on two sleeping, one Zen 5 machine), and spinning threads avoid the
// wake-ups (1.06 ms on two spinning against 1.42 on one, a Zen 4 machine) but hold every
// core while the step runs, so the HTTP thread waits for one. Where the crossings lie
// depends on the model and the machine, so they are measured as the steps run.

export type SessionKind = 'narrow' | 'wide' | 'spinning';

/**
 * Steps of more tokens than this never run on one thread: one thread pays off only for the
 * smallest (decode steps of a few rows, a short prompt: m25 int4's 20-token prompt took 14.1 ms
 * on one thread and 19.3 on two in one run, and as long in another), and trying a long prompt on
 * one thread would cost more than it could save.
 */
export const NARROW_STEP_TOKENS_MAX = 32;
/**
 * Steps run on spinning threads only while the model holds at most this many sequences. Its
 * threads then hold both cores for the whole step, and the HTTP thread, woken by a request,
 * waits for one: with every step spinning, the gateway's added p99 while 16 streams of m25 int4
 * generate rose from 1.6 to 2.4 ms (bench/README.md "Spinning while a step runs"). At a few
 * streams the HTTP thread has little to do and a step is short; at 16 the sleeping session
 * runs every step.
 */
export const SPINNING_SEQUENCES_MAX = 4;
/** Samples per session and size before the fastest one is trusted (each session's first run is not counted: it allocates). */
const SAMPLES_TO_TRUST = 4;
/** How often another session is tried again for a size, in steps of that size: an estimate must follow the load. */
const RETRY_OTHER_EVERY_STEPS = 64;
/**
 * A session's step time for a size is the fastest of its last this many runs. Runs are made
 * slow, never fast, by what is not the session's own doing: a new input shape (onnxruntime
 * plans its memory per shape), a pre-empted thread, a cold cache. A running mean carried such
 * runs for hundreds of steps and held a size on the slower session (m25 int4's one stream ran
 * on two threads at 2.4 ms a step when one thread took 1.6).
 */
const RECENT_RUNS = 8;
/**
 * How much faster another session must have become before a size changes sessions: the
 * daemon's steps share the cores with the HTTP thread, and without a margin two sessions
 * within that noise of each other took turns for long stretches.
 */
const SWITCH_MARGIN = 0.1;

/** The sessions a model has loaded besides its wide one. */
export interface LoadedSessions {
  narrow: boolean;
  spinning: boolean;
}

/** The sessions a step may run on: `tokens` is rows x new tokens, `sequences` the sequences the model holds. */
export function sessionsFor(tokens: number, sequences: number, loaded: LoadedSessions): SessionKind[] {
  const kinds: SessionKind[] = ['wide'];
  if (loaded.narrow && tokens <= NARROW_STEP_TOKENS_MAX) kinds.push('narrow');
  if (loaded.spinning && sequences <= SPINNING_SEQUENCES_MAX) kinds.push('spinning');
  return kinds;
}

interface Estimate {
  /** Runs seen, the uncounted first included. */
  runs: number;
  /** The last RECENT_RUNS run times, oldest first. */
  recent: number[];
}

/** One step size's estimates, and per set of allowed sessions the one its steps run on. */
interface Bucket {
  est: Record<SessionKind, Estimate>;
  /** By allowed set (kinds joined): the session its steps run on once all are measured. */
  current: Map<string, SessionKind>;
  /** By allowed set: steps since another session was last tried, and which was tried last. */
  sinceRetry: Map<string, number>;
  lastRetried: Map<string, SessionKind>;
}

function fastestMs(e: Estimate): number {
  return Math.min(...e.recent);
}

/** Step sizes in buckets of powers of two: 1, 2, 3-4, 5-8, ... tokens. */
function bucketOf(tokens: number): number {
  return Math.ceil(Math.log2(Math.max(1, tokens)));
}

export class SessionChoice {
  private readonly buckets = new Map<number, Bucket>();

  private of(tokens: number): Bucket {
    const key = bucketOf(tokens);
    let b = this.buckets.get(key);
    if (!b) {
      const none = (): Estimate => ({ runs: 0, recent: [] });
      b = { est: { narrow: none(), wide: none(), spinning: none() }, current: new Map(), sinceRetry: new Map(), lastRetried: new Map() };
      this.buckets.set(key, b);
    }
    return b;
  }

  /** The session of these allowed ones now: once all are measured, the fastest, changed only past the margin. */
  private current(b: Bucket, kinds: readonly SessionKind[]): SessionKind | undefined {
    if (kinds.length === 1) return kinds[0];
    if (kinds.some((k) => b.est[k].runs <= SAMPLES_TO_TRUST)) return undefined;
    const key = kinds.join();
    let fastest = kinds[0]!;
    for (const k of kinds) if (fastestMs(b.est[k]) < fastestMs(b.est[fastest])) fastest = k;
    const now = b.current.get(key);
    if (now === undefined || !kinds.includes(now) || fastestMs(b.est[fastest]) < fastestMs(b.est[now]) * (1 - SWITCH_MARGIN)) b.current.set(key, fastest);
    return b.current.get(key);
  }

  /** The session a step of `tokens` tokens (rows x new tokens) should run on, of the allowed `kinds` (sessionsFor). */
  pick(tokens: number, kinds: readonly SessionKind[]): SessionKind {
    const b = this.of(tokens);
    const now = this.current(b, kinds);
    // Until all are known, take them in turns (the one with fewest runs goes next).
    if (now === undefined) return kinds.reduce((a, k) => (b.est[k].runs < b.est[a].runs ? k : a));
    if (kinds.length === 1) return now;
    const key = kinds.join();
    const since = ((b.sinceRetry.get(key) ?? 0) + 1) % RETRY_OTHER_EVERY_STEPS;
    b.sinceRetry.set(key, since);
    if (since !== 0) return now;
    // Another session's turn: the others in rotation, so each is seen again now and then.
    const others = kinds.filter((k) => k !== now);
    const last = b.lastRetried.get(key);
    const next = others[(others.indexOf(last as SessionKind) + 1) % others.length]!;
    b.lastRetried.set(key, next);
    return next;
  }

  /** Counts a step's run time into its session's estimate for its size. */
  record(tokens: number, kind: SessionKind, ms: number): void {
    const s = this.of(tokens).est[kind];
    s.runs++;
    if (s.runs === 1) return;
    s.recent.push(ms);
    if (s.recent.length > RECENT_RUNS) s.recent.shift();
  }

  /** Runs a step of `tokens` tokens on the session picked for its size of the allowed `kinds` (`on` runs it there) and counts its time. */
  async run<T>(tokens: number, kinds: readonly SessionKind[], on: (kind: SessionKind) => Promise<T>): Promise<{ out: T; kind: SessionKind }> {
    const kind = this.pick(tokens, kinds);
    const t0 = performance.now();
    const out = await on(kind);
    if (kinds.length > 1) this.record(tokens, kind, performance.now() - t0);
    return { out, kind };
  }

  /** The session steps of this size run on now with these sessions allowed (tests, logs): undefined while still measuring. */
  chosen(tokens: number, kinds: readonly SessionKind[]): SessionKind | undefined {
    return this.current(this.of(tokens), kinds);
  }
}
