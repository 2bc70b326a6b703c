// The HTTP thread's costly work, cut into turns of its event loop. Between two turns the
// loop reads its sockets again and answers what arrived meanwhile, so a cheap request
// (GET /v1/models) waits for one turn, not for every piece of work that was ready with it
// (the gateway's added p99 while 16 streams generate, bench/README.md "Turns" and
// "The HTTP thread's turns under load").
//
// An immediate set from an immediate runs in the next turn, after its I/O: each kind of
// work below chains its turns that way.

// Requests. Those that arrive together (16 streaming clients whose completions end on the
// same step send their next request at once) were admitted back to back in one stretch:
// each is ~0.3-1 ms of parsing, tokenising and admission.

const waiting: Array<() => void> = [];
let scheduled = false;

/** Lets one waiter go, then, from the next turn of the loop, the next one. */
function release(): void {
  waiting.shift()?.();
  if (waiting.length) setImmediate(release);
  else scheduled = false;
}

/** Resolves in a turn of the event loop of this caller's own, in arrival order. */
export function takeTurn(): Promise<void> {
  return new Promise((resolve) => {
    waiting.push(resolve);
    if (!scheduled) {
      scheduled = true;
      setImmediate(release);
    }
  });
}

// Readers of token streams. A decode step of 16 rows hands 16 readers a token at once, and
// each reader's turn of work (its text, its SSE frame as JSON, the frame queued) is
// ~20-40 us on a 2-core VM: woken together they ran as one stretch of the loop, with the
// step's own bookkeeping before them, up to 1-2.5 ms on the CPU (a Zen 3, stories260K at
// ~7,000 tokens/s).

/**
 * Readers woken in one turn of the loop: a turn of 4 readers is ~0.1-0.2 ms. One or a few
 * streams are woken at once, as before; a larger batch's readers take several turns, the
 * last of 16 a few tenths of a millisecond later, well within a step of 16 rows (~2 ms of
 * stories260K, 7-10 ms of a 25M model).
 */
export const READERS_WOKEN_PER_TURN = 4;

/** A reader that waits for its next event: `wake` is set while it waits. */
export interface Reader {
  wake: (() => void) | undefined;
}

/** Readers waiting for a turn, in the order they were woken (a Set keeps its insertion order). */
const readers = new Set<Reader>();
let wokenThisTurn = 0;
let readerTurnScheduled = false;

/** Wakes the first readers of each turn at once; the rest wait for the next turns, in order. */
export function wakeReader(r: Reader): void {
  if (readers.has(r)) return;
  if (!readers.size && wokenThisTurn < READERS_WOKEN_PER_TURN) {
    wokenThisTurn++;
    r.wake?.();
  } else readers.add(r);
  if (!readerTurnScheduled) {
    readerTurnScheduled = true;
    setImmediate(readerTurn);
  }
}

/** A turn of readers: the next few queued. It runs once more after any turn that woke some, to start the next turn's count. */
function readerTurn(): void {
  wokenThisTurn = 0;
  for (const r of readers) {
    if (wokenThisTurn === READERS_WOKEN_PER_TURN) break;
    readers.delete(r);
    wokenThisTurn++;
    r.wake?.();
  }
  if (wokenThisTurn) setImmediate(readerTurn);
  else readerTurnScheduled = false;
}
