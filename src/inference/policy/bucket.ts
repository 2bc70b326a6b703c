// A token bucket: `capacity` units, refilled continuously to full over one
// minute (limits are per minute). Time comes from the caller, so tests use a
// fake clock. Reservations are returned with `give` when a request used less.

export const WINDOW_MS = 60_000;

export class TokenBucket {
  private level: number;
  private at: number;

  constructor(
    readonly capacity: number,
    now: number,
  ) {
    this.level = capacity;
    this.at = now;
  }

  private refill(now: number): void {
    if (now > this.at) {
      this.level = Math.min(this.capacity, this.level + ((now - this.at) * this.capacity) / WINDOW_MS);
      this.at = now;
    }
  }

  /** How long until `n` units are available (0 if now). `n` over capacity never fits. */
  waitMs(n: number, now: number): number {
    this.refill(now);
    if (n > this.capacity) return Infinity;
    return this.level >= n ? 0 : Math.ceil(((n - this.level) * WINDOW_MS) / this.capacity);
  }

  take(n: number, now: number): void {
    this.refill(now);
    this.level -= n;
  }

  give(n: number, now: number): void {
    this.refill(now);
    this.level = Math.min(this.capacity, this.level + n);
  }

  remaining(now: number): number {
    this.refill(now);
    return Math.max(0, Math.floor(this.level));
  }

  /** Time until the bucket is full again. */
  resetMs(now: number): number {
    this.refill(now);
    return Math.ceil(((this.capacity - Math.max(0, this.level)) * WINDOW_MS) / this.capacity);
  }
}

/** OpenAI's duration format for x-ratelimit-reset-*: "1s", "6m0s", "250ms". */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.ceil(ms))}ms`;
  const s = Math.ceil(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  return `${m}m${s % 60}s`;
}
