// How fast a model runs while it has work, so that admission can say how long a
// new request would wait (issue 12.6: admission used to count requests, and admitted
// requests waited 53-60 s while their clients gave up). Two measures: how often slots
// have been freeing up (CompletionRate), and, while too few requests have ended lately
// for that to tell (a fresh or long-idle model, or every slot held by long streams), the
// work ahead at face value (StepPace, slotWaitMs): every request running or waiting
// makes its max_tokens at the measured step time.

import type { WarmPace } from './protocol.js';

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

/** Batch sizes in buckets of powers of two (1, 2, 3-4, 5-8, ...): what a row costs changes with the batch size, little within a bucket. */
const bucketOf = (rows: number): number => Math.ceil(Math.log2(Math.max(1, rows)));
/**
 * How much a new step weighs in its bucket's measure: the last ~20 steps, a fraction of a
 * second at a full batch, so the pace follows what the model now runs.
 */
const PACE_STEP_WEIGHT = 0.05;

/**
 * What a row of a decode step costs besides reading its cache, in positions of cache: a row's
 * share of the products and the rest of the step. At 64 rows of m25 int4 a step took 20.9 ms
 * with its rows at position 36 on average and 48.4 ms at 420 (one run, this machine): a row's
 * cost is about proportional to its position plus ~270, so a step's time is taken as
 * proportional to the rows' positions plus this each. A larger model's rows cost more besides
 * their cache (m110 int4's 64-row step took 43-52 ms at positions 36 to 83), so for it this
 * overstates what longer rows add, which only makes admission refuse sooner.
 */
const ROW_BASE_POSITIONS = 256;

/**
 * A model's step times, kept while it idles (its speed does not change then): a decode step's
 * time a unit of work (a row-position, ROW_BASE_POSITIONS more a row) by batch size, and a
 * prompt token's. Seeded at load by the worker's warm-up (WarmPace: one row, a batch of rows,
 * a short prompt), then by the steps the model runs.
 */
export class StepPace {
  /** By batch bucket: ms a unit of work (decode). */
  private readonly unitMs = new Map<number, number>();
  private tokenMs: number | undefined;

  /** A decode step of `rows` rows whose positions sum to `positions` took `ms` (in the worker, the step alone). */
  decode(rows: number, positions: number, ms: number): void {
    if (!(rows > 0 && positions >= 0 && ms > 0)) return;
    const b = bucketOf(rows);
    const unit = ms / (positions + rows * ROW_BASE_POSITIONS);
    const was = this.unitMs.get(b);
    this.unitMs.set(b, was === undefined ? unit : was + PACE_STEP_WEIGHT * (unit - was));
  }

  /** A prompt step of `tokens` tokens took `ms`. */
  prompt(tokens: number, ms: number): void {
    if (!(tokens > 0 && ms > 0)) return;
    const was = this.tokenMs;
    this.tokenMs = was === undefined ? ms / tokens : was + PACE_STEP_WEIGHT * (ms / tokens - was);
  }

  /**
   * What a decode step of `rows` rows at mean position `position` takes: at its bucket's time a
   * unit; else the nearest smaller bucket's (a row costs less in a larger batch, so this says
   * more, never less); else the nearest larger bucket's as a step of that many rows (fewer rows
   * take no longer). Undefined while no decode step was measured.
   */
  decodeStepMs(rows: number, position: number): number | undefined {
    const b = bucketOf(rows);
    let below: number | undefined;
    let above: number | undefined;
    for (const k of this.unitMs.keys()) {
      if (k <= b && (below === undefined || k > below)) below = k;
      if (k > b && (above === undefined || k < above)) above = k;
    }
    const at = below ?? above;
    if (at === undefined) return undefined;
    return this.unitMs.get(at)! * (below === undefined ? 2 ** above! : rows) * (position + ROW_BASE_POSITIONS);
  }

  /** Seeds it with the worker's warm-up, before any step of the model's own was measured. */
  seed(warm: WarmPace): void {
    this.decode(1, warm.decodePosition, warm.decodeStepMs);
    if (warm.batch) this.decode(warm.batch.rows, warm.batch.rows * warm.batch.position, warm.batch.stepMs);
    this.prompt(warm.promptTokens, warm.promptMs);
  }

  /** What a prompt token takes: as measured, else undefined. */
  promptTokenMs(): number | undefined {
    return this.tokenMs;
  }
}

/** A request waiting for a batch slot, as slotWaitMs counts it. */
export interface QueuedWork {
  /** Its prompt's time: the worker runs prompts between decode steps, so it holds up every slot. */
  promptMs: number;
  /** Its decode steps' time once it has a slot. */
  decodeMs: number;
}

/**
 * When a request that queues behind `waiting` would get a batch slot, in ms from now: `holding`
 * says when each held slot frees, `waiting` what each request ahead (in queue order) does once it
 * has a slot, and the slots not held are free now. First come, first served: each slot that frees
 * goes to the queue's head, whose prompt then delays every slot.
 */
export function slotWaitMs(slots: number, holding: readonly number[], waiting: readonly QueuedWork[]): number {
  // When each slot is next free, ascending, less `delay`: the prompts run so far, which hold up every slot alike.
  const free = [...Array<number>(Math.max(0, slots - holding.length)).fill(0), ...holding].sort((a, b) => a - b);
  if (free.length === 0) return Infinity;
  let delay = 0;
  for (const w of waiting) {
    const start = free.shift()! + delay;
    delay += w.promptMs;
    const back = start + w.promptMs + w.decodeMs - delay;
    // The first place past every slot free by then (a binary search: a queue of hundreds at each admission).
    let [lo, hi] = [0, free.length];
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (free[mid]! <= back) lo = mid + 1;
      else hi = mid;
    }
    free.splice(lo, 0, back);
  }
  return free[0]! + delay;
}
