import { databaseDown, isDatabaseUnavailable, OUTAGE_STALE_MS_MAX } from './db/bounded.js';

/**
 * The one cache of database reads: entries live `ttlMs` (per entry when a caller says),
 * at most `entriesMax` of them (the oldest goes: keys often come from requests), and
 * during a database outage an entry read within OUTAGE_STALE_MS_MAX past its life still
 * answers (src/db/bounded.ts). `clear()` starts a new generation: a read that began
 * before it is not kept, so a change that raced a read is never undone by it.
 */
export class TtlCache<V> {
  private readonly m = new Map<string, { v: V; at: number; ttlMs: number }>();
  private gen = 0;

  constructor(
    private readonly ttlMs: number,
    private readonly entriesMax: number,
  ) {}

  /** The cached value, or `load()`'s (kept for `ttlMs`; 0 keeps nothing). */
  async get(key: string, load: () => Promise<V>, ttlMs = this.ttlMs, now = Date.now()): Promise<V> {
    const hit = this.m.get(key);
    if (hit && now - hit.at < hit.ttlMs) return hit.v;
    const usable = hit !== undefined && now - hit.at < hit.ttlMs + OUTAGE_STALE_MS_MAX;
    // The database just failed: a cached answer serves at once instead of waiting on it again.
    if (usable && databaseDown()) return hit.v;
    const gen = this.gen;
    let v: V;
    try {
      v = await load();
    } catch (e) {
      if (usable && isDatabaseUnavailable(e)) return hit.v;
      throw e;
    }
    if (ttlMs > 0 && gen === this.gen) {
      if (!this.m.has(key) && this.m.size >= this.entriesMax) this.m.delete(this.m.keys().next().value!);
      this.m.set(key, { v, at: now, ttlMs });
    }
    return v;
  }

  delete(key: string): void {
    this.m.delete(key);
  }

  /** Changes a cached value in place (a balance after a charge), keeping its age. */
  adjust(key: string, f: (v: V) => V): void {
    const hit = this.m.get(key);
    if (hit) hit.v = f(hit.v);
  }

  clear(): void {
    this.gen++;
    this.m.clear();
  }
}
