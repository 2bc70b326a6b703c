// A chat model's data-parallel replicas (MODEL_REPLICAS): the same graph loaded in several
// workers, each with its own sequences and KV cache, the model's requests spread over them.
//
// Why: a decode step of a small model is hundreds of operators of microseconds each, too small
// to split well over the cores (bench/README.md "The slot capacity grown finely": a quarter of a
// 2-core machine idled at 16 streams). Two workers of one thread each run two half-batches at
// once with no intra-op barrier: m25 int4, 8 rows a step on one thread, 6.7-7.0 ms for each of
// two at once, against 9.4-10.0 ms for 16 rows on two spinning threads (bench/README.md
// "Replicas"). And the HTTP thread, taking a core, delays one replica's step, not both threads
// of one step.
//
// A replica alone keeps every core: each publishes how many sequences it holds in memory the
// replicas share, and a step while another replica holds any runs on one thread (its narrow
// session, session-choice.ts), so one stream keeps its two-thread steps and sixteen get one
// thread per replica.

/** What one replica's worker shares with its siblings: `live[i]` is the sequences replica i holds. */
export interface ReplicaShare {
  live: Int32Array;
  index: number;
}

/** The shares of `n` replicas of one model, over one shared buffer. */
export function replicaShares(n: number): ReplicaShare[] {
  const live = new Int32Array(new SharedArrayBuffer(n * Int32Array.BYTES_PER_ELEMENT));
  return Array.from({ length: n }, (_, index) => ({ live, index }));
}

/** A worker's view of its siblings; without a share (one replica) never crowded. */
export class ReplicaPeers {
  constructor(private readonly share?: ReplicaShare) {}

  /** Tells the siblings how many sequences this replica holds now. */
  publish(live: number): void {
    if (this.share) Atomics.store(this.share.live, this.share.index, live);
  }

  /** Whether another replica holds sequences: its steps share the cores with this one's. */
  crowded(): boolean {
    const s = this.share;
    if (!s) return false;
    for (let i = 0; i < s.live.length; i++) if (i !== s.index && Atomics.load(s.live, i) > 0) return true;
    return false;
  }
}

/**
 * The replica a new request goes to: of those up, the one holding the fewest requests (running
 * and waiting), the first on a tie, so that a lone stream stays on one replica, its caches warm.
 * All down: the first, whose refusal names the model down.
 */
export function pickReplica<T extends { load(): number; readonly alive: boolean }>(replicas: readonly T[]): T {
  let best: T | undefined;
  let bestLoad = Infinity;
  for (const r of replicas) {
    if (!r.alive) continue;
    const load = r.load();
    if (load < bestLoad) [best, bestLoad] = [r, load];
  }
  return best ?? replicas[0]!;
}
