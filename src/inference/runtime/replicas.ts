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
// A replica alone keeps every core: like every model worker it tells the others how many
// sequences it holds (peers.ts), and a step while the busy workers fill the cores runs on one
// thread (its narrow session, or its prefill graph on one thread), so one stream keeps its
// two-thread steps and sixteen get one thread per replica.

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
