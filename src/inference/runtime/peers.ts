// The model workers of this daemon, as each sees the others: how many sequences each holds, in
// memory they share, so that a step knows whether the cores are its own.
//
// Each worker's sessions on every core assume the cores are free. Two busy workers on a
// 2-core machine, each stepping on both cores, take turns on them (each operator wakes two
// threads that then wait for a core), and spinning ones hold a core the other needs: two
// copies of m25 int4 made 1.28x / 1.30x the tokens/s together at 1 / 8 streams each, m25 beside
// m110 1.60x / 1.56x, with this rule (bench/README.md "Models beside each other"). So once the workers holding sequences fill the
// cores, each steps on one thread (session-choice.ts `sessionsFor`, crowded); a worker whose
// model is alone keeps every core. Replicas of one model (replicas.ts) share the cores the
// same way.
//
// A worker counts as busy while it steps, not while it merely holds sequences: one whose every
// sequence waits on a reader that stopped reading (the scheduler pauses it) runs no step, and
// counted as busy it kept the others on one thread each for as long as that reader stayed away.
// So a worker that has had no work for PEERS_REST_AFTER_IDLE_MS shows none (worker.ts).

/**
 * A worker with no work this long shows no sequences to the others. Far above the round trip
 * between two pieces of a busy worker's work (a decode run's end to the next run: under a
 * millisecond, a few on a loaded HTTP thread), so a busy worker does not flicker idle between
 * them; far below a reader's pause that is worth the cores.
 */
export const PEERS_REST_AFTER_IDLE_MS = 50;

/** What one worker shares with the others: `live[i]` is the sequences worker i holds; `cores` the machine's. */
export interface PeerShare {
  live: Int32Array;
  index: number;
  cores: number;
}

/** The shares of `n` workers over one shared buffer, on a machine of `cores` cores. */
export function peerShares(n: number, cores: number): PeerShare[] {
  const live = new Int32Array(new SharedArrayBuffer(n * Int32Array.BYTES_PER_ELEMENT));
  return Array.from({ length: n }, (_, index) => ({ live, index, cores }));
}

/** A worker's view of the others; without a share (a GPU model, a test) never crowded. */
export class WorkerPeers {
  /** Resting (rest()): the others see no sequences until this worker steps again. */
  private resting = false;

  constructor(private readonly share?: PeerShare) {}

  /** This worker steps now, holding `live` sequences: the others see them. */
  stepping(live: number): void {
    this.resting = false;
    this.store(live);
  }

  /** Sequences were freed and `live` are left: a resting worker still shows none. */
  freed(live: number): void {
    this.store(this.resting ? 0 : live);
  }

  /** This worker has no work (PEERS_REST_AFTER_IDLE_MS): the others see none, whatever it holds. */
  rest(): void {
    this.resting = true;
    this.store(0);
  }

  private store(live: number): void {
    if (this.share) Atomics.store(this.share.live, this.share.index, live);
  }

  /** Whether the other workers holding sequences take the cores but one: this one then gets one. */
  crowded(): boolean {
    const s = this.share;
    if (!s) return false;
    let busy = 0;
    for (let i = 0; i < s.live.length; i++) if (i !== s.index && Atomics.load(s.live, i) > 0) busy++;
    return busy > 0 && busy >= s.cores - 1;
  }
}
