import type { Sql } from '../db/index.js';
import { log } from '../log.js';

// Pod lists answered from memory while nothing that could change them has
// happened. What a list shows depends on pods (their record, owner, team,
// sharing, termination), team memberships and per-user shares; a trigger on
// those tables NOTIFYs `POD_READS_CHANNEL` at commit (migration 112), and every
// daemon on the database LISTENs and drops its entries. A daemon that makes
// the change itself also drops them as soon as its transaction has committed,
// before it answers, so a client reads its own writes at once; other daemons
// see them within a notification's delay (a millisecond or so).
//
// The generation makes a load that raced with a change harmless: an answer
// is kept only if no change arrived while it was being read.

export const POD_READS_CHANNEL = 'cloudgate_pod_reads';
/** Memory for cached answers: a list of 1000 pods is about 1 MB, so this holds dozens of the largest and thousands of typical ones. */
const POD_READS_CACHE_BYTES_MAX = 64 * 1024 * 1024;

class PodReads {
  private gen = 0;
  private bytes = 0;
  private readonly entries = new Map<string, string>();

  /** Drops every cached answer (a change committed somewhere). */
  changed(): void {
    this.gen++;
    this.entries.clear();
    this.bytes = 0;
  }

  async get(key: string, load: () => Promise<string>): Promise<string> {
    const hit = this.entries.get(key);
    if (hit !== undefined) return hit;
    const gen = this.gen;
    const text = await load();
    if (gen === this.gen && this.bytes + text.length <= POD_READS_CACHE_BYTES_MAX) {
      this.entries.set(key, text);
      this.bytes += text.length;
    }
    return text;
  }

  /**
   * Listens for changes made by any daemon. Until the listener is up (and
   * whenever it reconnects, when notifications may have been missed) the
   * cache is dropped, and it is bypassed while no listener is connected.
   */
  async listen(sql: Sql): Promise<() => Promise<void>> {
    this.listening = false;
    const l = await sql.listen(
      POD_READS_CHANNEL,
      () => this.changed(),
      () => {
        this.changed();
        this.listening = true;
      },
    );
    return async () => {
      this.listening = false;
      await l.unlisten().catch((e: unknown) => log.warn({ err: e }, 'pod reads: unlisten failed'));
    };
  }

  /** False while no listener is connected: then every read goes to the database. */
  listening = false;
}

export const podReads = new PodReads();

/** Reads through the cache when a listener is connected, else straight from the database. */
export function cachedRead(key: string, load: () => Promise<string>): Promise<string> {
  return podReads.listening ? podReads.get(key, load) : load();
}
