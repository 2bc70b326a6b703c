// Which of a model's sessions runs a step: the one on every core whose threads sleep
// between operators ("wide"), a one-thread session of the same graph ("narrow"), or one
// on every core whose threads spin while a run lasts and 1 ms after ("spinning", spin.ts). A step of a few tokens
// on a small model is a few hundred operators of microseconds each: waking sleeping
// threads for each of them costs more than they save (m25 int4 at batch 1: 1.30 ms on one
// thread, 2.03 ms on two sleeping, one Zen 5 machine), and spinning threads avoid the
// wake-ups (1.06 ms on two spinning against 1.42 on one, a Zen 4 machine) but hold every
// core while the step runs, so the HTTP thread waits for one. A model of block-quantized
// weights (int8, q4) may also have a session for steps of several rows ("prefill",
// prefill-graph.ts: its products as int8 ones, whose kernel is the faster one from a few rows
// on), and while few sequences run, the same on spinning threads for short steps
// ("prefillSpinning": a chat prompt's), and for a long prompt's steps that graph with its attention
// in pieces of the queries ("long", long-steps.ts). Where the crossings lie
// depends on the model and the machine, so they are measured as the steps run.

export type SessionKind = 'narrow' | 'wide' | 'spinning' | 'prefill' | 'prefillSpinning' | 'prefillNarrow' | 'long';

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
/**
 * Steps of fewer tokens than this never run on the prefill session (prefill-graph.ts: int8
 * products, each row's activations rounded on their own). Its products gain from a few rows
 * on, and lose at one, where onnxruntime's block-quantized kernel reads fewer bytes: a decode
 * step of m25 int4, two sleeping threads, one Intel machine with AMX, 8.43 ms against 6.69 at 16
 * rows, 2.74 against 2.82 at 4, 1.53 against 2.13 at 1 (bench/README.md "Long steps in integers").
 */
export const PREFILL_STEP_TOKENS_MIN = 8;
/**
 * Steps of more tokens than this never run on the prefill session's spinning twin: a short
 * prompt's step is a few hundred operators, each of which wakes sleeping threads (a 20-token
 * prompt of m25 int4 on the int8 products: 6.6 ms on two sleeping threads, 4.3-5.3 on two
 * spinning, one Intel machine with AMX), where a long prompt's operators are long enough that the
 * wake-ups are a small part of them; and each session keeps an arena sized to the longest step it
 * ran, which for a spinning twin of every long step would be one more copy of a long prompt's.
 */
export const PREFILL_SPINNING_STEP_TOKENS_MAX = 32;
/**
 * Steps whose longest row adds at least this many tokens run on the long-step session
 * (long-steps.ts), where it loaded, and there alone: the prefill graph, its attention in pieces of
 * a row's queries. That gains where the row's score tensors spill the caches: one step of m25 int4
 * (`bench/long-steps.js`) took 0.616 of the prefill graph's time at 1,000 tokens, 0.881 at 768,
 * 1.007 at 640 and 1.066 at 512 (m110 int4 0.854 and 0.912), and many short rows (64 prompts
 * joining at once) are short pieces. Nothing else is measured at these sizes: each session measured
 * at a long size costs a few long steps on it (2,000-token prompts of m25 int4 took 2.2-3.7 s
 * instead of 0.9 while the 4-bit sessions' were measured, ten prompts before the size settled), and
 * the graph as converted has lost every long step to the int8 products on every machine measured
 * (295 ms against 178 at 1,000 tokens here; bench/README.md "Long steps in integers"). With the
 * prefill session also offered, a 1,000-token prompt's time to first token read 0.965 over ten
 * prompts, where the step alone read 0.56-0.80.
 */
export const LONG_SESSION_STEP_TOKENS_MIN = 640;
/**
 * Steps of at least this many tokens may count as long (LONG_RUN_MS): a prompt's, not a decode
 * step's, whose retries must stay frequent (below).
 */
const LONG_STEP_TOKENS_MIN = NARROW_STEP_TOKENS_MAX + 1;
/** Counted runs per session and size before the fastest one is trusted. */
const SAMPLES_TO_TRUST = 4;
/**
 * A size whose runs take at least this long (a prompt of hundreds of tokens) is measured with
 * fewer of them: a switch's cost (weights out of the caches, threads asleep) is a small part of
 * such a run, and each costs what a hundred decode steps do. A 512-token prompt of m25 int4
 * (~250 ms) on three sessions was 18 runs in measuring at the short sizes' rule (12 now). Long
 * sizes count every run but each session's first, in bursts of one, trust SAMPLES_TO_TRUST_LONG a
 * session, and retry another every RETRY_OTHER_EVERY_LONG_STEPS. Only steps of at least
 * LONG_STEP_TOKENS_MIN tokens count as long: a decode step of 16 rows of m110 int4 takes ~21
 * ms, and its retries run on a one-thread session ~40 % slower, which every 16 steps would cost
 * ~2.6 % of 16 streams' rate where bursts every 256 cost ~0.5 %; and one pre-empted short step
 * must not move its size to the long rule for good.
 */
const LONG_RUN_MS = 20;
const SAMPLES_TO_TRUST_LONG = 3;
/**
 * At a long size a session whose counted runs take this many times another's is measured no
 * further (the retries, every RETRY_OTHER_EVERY_LONG_STEPS, still move the size to it if that
 * run misled): on a Zen 4 machine the prefill session's 380-token steps
 * took ~30 % longer than the int8 products', and measuring each size with 3 of them made the
 * first requests of every size of an evaluation slower at q4 than at fp32 (bench/README.md
 * "Long sizes decided early").
 */
const LONG_SLOWER_RATIO = 1.25;
const RETRY_OTHER_EVERY_LONG_STEPS = 16;
/**
 * How often another session is tried again for a size, in steps of that size: an estimate must
 * follow the load, and each retry (a burst, below) runs steps on a session that was slower. At
 * 64, one stream of m25 int4 ran 18 of every 400 steps on the slower sessions (~2 % of its
 * rate); at 256 a change of load is still seen within a few seconds at 16 rows of 7 ms.
 */
const RETRY_OTHER_EVERY_STEPS = 256;
/**
 * A session runs this many steps in a row whenever it is measured or tried again, and the first
 * of them is not counted: each session holds its own copy of the weights, and the first step
 * after others ran finds them out of the caches (and its threads asleep). Single retries counted
 * that cost: one stream of m25 int4 stayed 14 s on one thread at 1.5 ms a step before its
 * retries showed spinning threads faster (1.1 ms once they ran).
 */
const BURST_STEPS = 3;
/**
 * While the sessions are first measured, in turns, a session's step time for a size is the
 * fastest of its last this many runs. Runs are made slow, never fast, by what is not the
 * session's own doing: a new input shape (onnxruntime plans its memory per shape), a pre-empted
 * thread, a cold cache. A running mean carried such runs for hundreds of steps and held a size on
 * the slower session (m25 int4's one stream ran on two threads at 2.4 ms a step when one thread
 * took 1.6). The session a size runs on is judged against its last this many runs too.
 */
const RECENT_RUNS = 8;
/**
 * Once a size runs on one session, another is judged by its retries, each against the running
 * session's runs just before it (their median): this machine's speed drifts by up to 2x within
 * seconds, and the fastest of a retried session's last 8 runs, spread over a thousand steps, was
 * compared with the fastest of the running one's last 8 steps, a few milliseconds: the retried
 * one looked faster because it had met a faster moment, and one stream of m25 int4 spent 8 s of
 * 15 on one thread at 1.7 ms a step where spinning threads took 1.2 (bench/README.md "Spinning
 * for a few streams"). A size moves when the median of another's last this many ratios is past
 * the margin.
 */
const RATIOS_TO_SWITCH = 4;
/**
 * How much faster another session must be before a size changes sessions: the daemon's steps
 * share the cores with the HTTP thread, and without a margin two sessions within that noise of
 * each other took turns for long stretches.
 */
const SWITCH_MARGIN = 0.1;

/** The sessions a model has loaded besides its wide one. */
export interface LoadedSessions {
  narrow: boolean;
  spinning: boolean;
  /** The spinning session runs the one-token graph (one-token-graph.ts): steps of one token a row only. */
  spinningOneToken?: boolean;
  prefill: boolean;
  prefillSpinning: boolean;
  /** The prefill graph on one thread, for steps while other model workers fill the cores (peers.ts); absent: not loaded. */
  prefillNarrow?: boolean;
  /** The prefill graph with its attention in pieces, for long steps (long-steps.ts); absent: not loaded. */
  long?: boolean;
}

/** Each kind's bit in a set of allowed sessions: a set is a small number, the key of its state below. */
const KIND_BIT: Record<SessionKind, number> = { wide: 1, narrow: 2, spinning: 4, prefill: 8, prefillSpinning: 16, prefillNarrow: 32, long: 64 };
// `long` is in no set with others: a long row runs there alone (LONG_ONLY).
const EXTRA_KINDS = ['narrow', 'spinning', 'prefill', 'prefillSpinning'] as const;
const setOf = (kinds: readonly SessionKind[]): number => kinds.reduce((m, k) => m | KIND_BIT[k], 0);
/** Every allowed set, one array each (the wide session first): a step asks for one and allocates nothing. */
const SETS = new Map<number, readonly SessionKind[]>();
for (let extra = 0; extra < 1 << EXTRA_KINDS.length; extra++) {
  const kinds: SessionKind[] = ['wide', ...EXTRA_KINDS.filter((_, i) => extra & (1 << i))];
  SETS.set(setOf(kinds), kinds);
}

/** A long row's session where it loaded (LONG_SESSION_STEP_TOKENS_MIN): alone, so not measured. */
const LONG_ONLY: readonly SessionKind[] = ['long'];
/** A crowded step's one-thread sessions (a set of one kind runs without being measured, SessionChoice.run). */
const CROWDED_SETS: ReadonlyArray<readonly SessionKind[]> = [[], ['narrow'], ['prefillNarrow'], ['narrow', 'prefillNarrow']];

/**
 * The sessions a step may run on: `tokens` is rows x new tokens, `sequences` the sequences the
 * model holds, `rowTokens` the new tokens of its longest row.
 */
export function sessionsFor(tokens: number, sequences: number, loaded: LoadedSessions, crowded = false, rowTokens = tokens): readonly SessionKind[] {
  // Other model workers' steps fill the cores but one (peers.ts): a step takes one core where
  // it has a one-thread session, and no step spins on the cores the others need.
  if (crowded) {
    const one = (loaded.narrow && tokens <= NARROW_STEP_TOKENS_MAX ? 1 : 0) | (loaded.prefillNarrow && tokens >= PREFILL_STEP_TOKENS_MIN ? 2 : 0);
    if (one) return CROWDED_SETS[one]!;
    return SETS.get(KIND_BIT.wide | (loaded.prefill && tokens >= PREFILL_STEP_TOKENS_MIN ? KIND_BIT.prefill : 0))!;
  }
  if (loaded.long && rowTokens >= LONG_SESSION_STEP_TOKENS_MIN) return LONG_ONLY;
  let set = KIND_BIT.wide;
  if (loaded.narrow && tokens <= NARROW_STEP_TOKENS_MAX) set |= KIND_BIT.narrow;
  if (loaded.spinning && sequences <= SPINNING_SEQUENCES_MAX && (!loaded.spinningOneToken || rowTokens === 1)) set |= KIND_BIT.spinning;
  if (loaded.prefill && tokens >= PREFILL_STEP_TOKENS_MIN) set |= KIND_BIT.prefill;
  if (loaded.prefillSpinning && sequences <= SPINNING_SEQUENCES_MAX && tokens >= PREFILL_STEP_TOKENS_MIN && tokens <= PREFILL_SPINNING_STEP_TOKENS_MAX) set |= KIND_BIT.prefillSpinning;
  return SETS.get(set)!;
}

interface Estimate {
  /** Runs seen, the uncounted included. */
  runs: number;
  /** The last RECENT_RUNS run times, oldest first. */
  recent: number[];
}

/** One step size's estimates, and per set of allowed sessions (setOf) the one its steps run on. */
interface Bucket {
  est: Record<SessionKind, Estimate>;
  /** The session its steps run on once all are measured. */
  current: Map<number, SessionKind>;
  /** Steps since another session was last tried, and which was tried last. */
  sinceRetry: Map<number, number>;
  lastRetried: Map<number, SessionKind>;
  /** By set and kind (ratioKey): the kind's last retries, each over the running session's recent median. */
  ratios: Map<number, number[]>;
  /** The session being measured or tried: its steps left in a row, and whether the next run is the first (not counted). */
  burst: { kind: SessionKind; left: number; first: boolean } | undefined;
  /** A step of this size (LONG_STEP_TOKENS_MIN tokens or more) took LONG_RUN_MS or more: measured with fewer runs. */
  long: boolean;
}

/** A set and a kind as one number: the set above every kind's bit. */
const KIND_BITS_SPAN = 2 * Math.max(...Object.values(KIND_BIT));
const ratioKey = (set: number, kind: SessionKind): number => set * KIND_BITS_SPAN + KIND_BIT[kind];

function fastestMs(e: Estimate): number {
  return Math.min(...e.recent);
}

/** The middle of `xs` (the upper one of an even count). */
export function medianOf(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1]!;
}

/**
 * The allowed sessions still measured for a size: all of them, except at a long size those whose
 * counted runs take LONG_SLOWER_RATIO times another's (one counted run each suffices there).
 */
function contenders(b: Bucket, kinds: readonly SessionKind[]): readonly SessionKind[] {
  if (!b.long) return kinds;
  let best = Infinity;
  for (const k of kinds) if (b.est[k].recent.length) best = Math.min(best, fastestMs(b.est[k]));
  return kinds.filter((k) => b.est[k].recent.length === 0 || fastestMs(b.est[k]) < LONG_SLOWER_RATIO * best);
}

/**
 * Step sizes in buckets of powers of two: 1, 2, 3-4, 5-8, ... tokens; and apart, the steps whose
 * rows all start with an empty cache (`fresh`: a prompt's first chunk, whose attention reads no
 * cache) from those that read one. A 2,000-token prompt of a 2,048-position m25 int4 ran as 1,024
 * tokens on an empty cache, then 976 over 2,048 positions. Both sat in one bucket, 0.2-0.3 s against
 * 0.4-0.5 s a step. Each session's first run at the second shape (it allocates) was counted against
 * the others' runs at the first. The prefill session then looked 3x slower than the spinning one
 * and was dropped, though it was the faster at both shapes (bench/README.md "Sessions chosen by
 * step shape").
 */
function bucketOf(tokens: number, fresh: boolean): number {
  return 2 * Math.ceil(Math.log2(Math.max(1, tokens))) + (fresh ? 1 : 0);
}

export class SessionChoice {
  private readonly buckets = new Map<number, Bucket>();

  private of(tokens: number, fresh: boolean): Bucket {
    const key = bucketOf(tokens, fresh);
    let b = this.buckets.get(key);
    if (!b) {
      const none = (): Estimate => ({ runs: 0, recent: [] });
      b = { est: { narrow: none(), wide: none(), spinning: none(), prefill: none(), prefillSpinning: none(), prefillNarrow: none(), long: none() }, current: new Map(), sinceRetry: new Map(), lastRetried: new Map(), ratios: new Map(), burst: undefined, long: false };
      this.buckets.set(key, b);
    }
    return b;
  }

  /**
   * The session of these allowed ones now: once all are measured (in turns), the fastest; after
   * that another only when its retries, each against the running one's runs beside it, say it is
   * faster past the margin.
   */
  private current(b: Bucket, kinds: readonly SessionKind[]): SessionKind | undefined {
    if (kinds.length === 1) return kinds[0];
    const trust = b.long ? SAMPLES_TO_TRUST_LONG : SAMPLES_TO_TRUST;
    if (contenders(b, kinds).some((k) => b.est[k].recent.length < trust)) return undefined;
    const key = setOf(kinds);
    const now = b.current.get(key);
    if (now === undefined || !kinds.includes(now)) {
      let fastest = kinds[0]!;
      for (const k of kinds) if (fastestMs(b.est[k]) < fastestMs(b.est[fastest])) fastest = k;
      b.current.set(key, fastest);
      return fastest;
    }
    let best: { kind: SessionKind; ratio: number } | undefined;
    for (const k of kinds) {
      const r = b.ratios.get(ratioKey(key, k));
      if (k === now || !r || r.length < RATIOS_TO_SWITCH) continue;
      const ratio = medianOf(r);
      if (ratio < 1 - SWITCH_MARGIN && (!best || ratio < best.ratio)) best = { kind: k, ratio };
    }
    if (!best) return now;
    // The ratios were against the session that ran until now: each kind starts again against the new one.
    for (const k of kinds) b.ratios.delete(ratioKey(key, k));
    b.current.set(key, best.kind);
    return best.kind;
  }

  /**
   * The session a step of `tokens` tokens (rows x new tokens) should run on, of the allowed `kinds`
   * (sessionsFor); `fresh`: its rows all start with an empty cache (bucketOf).
   */
  pick(tokens: number, kinds: readonly SessionKind[], fresh = false): SessionKind {
    const b = this.of(tokens, fresh);
    if (kinds.length === 1) return kinds[0]!;
    if (b.burst && b.burst.left > 0 && !b.long && kinds.includes(b.burst.kind)) {
      b.burst.left--;
      return b.burst.kind;
    }
    b.burst = undefined;
    const now = this.current(b, kinds);
    const burst = (kind: SessionKind): SessionKind => {
      b.burst = b.long ? { kind, left: 0, first: false } : { kind, left: BURST_STEPS - 1, first: true };
      return kind;
    };
    // Until all are known, take them in turns, a burst each (the one with fewest runs goes next).
    if (now === undefined) {
      const c = contenders(b, kinds);
      return burst(c.reduce((a, k) => (b.est[k].runs < b.est[a].runs ? k : a)));
    }
    const key = setOf(kinds);
    const since = ((b.sinceRetry.get(key) ?? 0) + 1) % (b.long ? RETRY_OTHER_EVERY_LONG_STEPS : RETRY_OTHER_EVERY_STEPS);
    b.sinceRetry.set(key, since);
    if (since !== 0) return now;
    // Another session's turn: the others in rotation, so each is seen again now and then.
    const others = kinds.filter((k) => k !== now);
    const last = b.lastRetried.get(key);
    const next = others[(others.indexOf(last as SessionKind) + 1) % others.length]!;
    b.lastRetried.set(key, next);
    return burst(next);
  }

  /** Counts a step's run time into its session's estimate for its size, with the allowed `kinds` it was picked from. */
  record(tokens: number, kinds: readonly SessionKind[], kind: SessionKind, ms: number, fresh = false): void {
    const b = this.of(tokens, fresh);
    const s = b.est[kind];
    s.runs++;
    if (ms >= LONG_RUN_MS && tokens >= LONG_STEP_TOKENS_MIN) b.long = true;
    // A long size counts a session's runs from its second: its first allocates the step's buffers
    // (the prefill session's first 512-token runs took 343 and 303 ms, then 195-220).
    if (b.long && s.runs === 1) return;
    if (b.burst?.kind === kind && b.burst.first && !b.long) {
      b.burst.first = false; // cold: its weights out of the caches
      return;
    }
    const key = setOf(kinds);
    const now = b.current.get(key);
    if (now !== undefined && now !== kind && kinds.includes(now) && b.est[now].recent.length > 0) {
      // A retry: judged against the running session's runs just before it.
      const r = b.ratios.get(ratioKey(key, kind)) ?? [];
      r.push(ms / medianOf(b.est[now].recent));
      if (r.length > RATIOS_TO_SWITCH) r.shift();
      b.ratios.set(ratioKey(key, kind), r);
    }
    s.recent.push(ms);
    if (s.recent.length > RECENT_RUNS) s.recent.shift();
  }

  /** Runs a step of `tokens` tokens on the session picked for its size of the allowed `kinds` (`on` runs it there) and counts its time. */
  async run<T>(tokens: number, kinds: readonly SessionKind[], on: (kind: SessionKind) => Promise<T>, fresh = false): Promise<{ out: T; kind: SessionKind }> {
    const kind = this.pick(tokens, kinds, fresh);
    const t0 = performance.now();
    const out = await on(kind);
    if (kinds.length > 1) this.record(tokens, kinds, kind, performance.now() - t0, fresh);
    return { out, kind };
  }

  /**
   * Runs steps of `tokens` tokens as live steps would run (`run`) until the size's session is
   * chosen, `runsMax` have run or `msMax` milliseconds have passed: the worker's warm-up at load, so that the first requests after
   * start run on the fastest session instead of being the slower sessions' measurements (a q4
   * evaluation's first state steps of m25 took ~170 ms there against ~60 on the int8 products;
   * bench/README.md "Long steps in integers").
   */
  async measure(tokens: number, kinds: readonly SessionKind[], runsMax: number, on: (kind: SessionKind) => Promise<unknown>, msMax = Infinity, fresh = false): Promise<void> {
    const until = performance.now() + msMax;
    for (let i = 0; i < runsMax && performance.now() < until && this.chosen(tokens, kinds, fresh) === undefined; i++) await this.run(tokens, kinds, on, fresh);
  }

  /** The session steps of this size run on now with these sessions allowed (tests, logs): undefined while still measuring. */
  chosen(tokens: number, kinds: readonly SessionKind[], fresh = false): SessionKind | undefined {
    return this.current(this.of(tokens, fresh), kinds);
  }
}
