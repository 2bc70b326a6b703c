// Costly request work, one request per turn of the event loop. Requests that arrive
// together (16 streaming clients whose completions end on the same step send their next
// request at once) were admitted back to back in one stretch of the HTTP thread: each is
// ~0.3-1 ms of parsing, tokenising and admission, and a request behind them, however
// cheap (GET /v1/models), waited for all of them (bursts of 5-40 ms in a CPU profile of
// the daemon at 16 streams, bench/README.md "Turns"). A request that takes its turn waits
// for the next turn that has none taken: in between, the loop reads its sockets again and
// answers what arrived meanwhile.

const waiting: Array<() => void> = [];
let scheduled = false;

/** Lets one waiter go, then, from the next turn of the loop, the next one. */
function release(): void {
  waiting.shift()?.();
  // An immediate set from an immediate runs in the next turn, after its I/O.
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
