import { describe, expect, it } from 'vitest';
import { READERS_WOKEN_PER_TURN, takeTurn, wakeReader, type Reader } from './turns.js';

describe('takeTurn', () => {
  it('lets waiters go one per turn of the event loop (I/O is read between turns), in arrival order', async () => {
    // A ticker that counts turns of the loop (an immediate re-armed from an immediate runs in the next turn).
    let turn = 0;
    let ticking = true;
    const tick = () => {
      turn++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    const order: Array<[number, number]> = [];
    const all = [0, 1, 2, 3].map((i) => takeTurn().then(() => order.push([i, turn])));
    await Promise.all(all);
    ticking = false;
    expect(order.map(([i]) => i)).toEqual([0, 1, 2, 3]);
    const turns = order.map(([, t]) => t);
    expect(new Set(turns).size).toBe(4);
  });

  it('goes at once when nobody waits', async () => {
    let later = false;
    setTimeout(() => (later = true), 5);
    await takeTurn();
    expect(later).toBe(false);
  });
});

describe('wakeReader', () => {
  /** Counts turns of the loop until stopped (an immediate re-armed from an immediate runs in the next turn). */
  const ticker = () => {
    const t = { turn: 0, ticking: true };
    const tick = () => {
      t.turn++;
      if (t.ticking) setImmediate(tick);
    };
    setImmediate(tick);
    return t;
  };
  const reader = (log: Array<[number, number]>, i: number, t: { turn: number }): Reader => {
    const r: Reader = { wake: undefined };
    r.wake = () => {
      log.push([i, t.turn]);
      r.wake = undefined; // as a reader does once it runs (scheduler.ts events)
    };
    return r;
  };
  const settle = () => new Promise((r) => setTimeout(r, 20));

  it(`wakes ${READERS_WOKEN_PER_TURN} readers at once and the rest ${READERS_WOKEN_PER_TURN} a turn, in order, in turns of their own`, async () => {
    await settle(); // no turn of an earlier test in flight
    const t = ticker();
    const log: Array<[number, number]> = [];
    const n = READERS_WOKEN_PER_TURN * 3 + 1;
    const rs = Array.from({ length: n }, (_, i) => reader(log, i, t));
    for (const r of rs) wakeReader(r);
    expect(log.map(([i]) => i)).toEqual(Array.from({ length: READERS_WOKEN_PER_TURN }, (_, i) => i));
    await settle();
    t.ticking = false;
    expect(log.map(([i]) => i)).toEqual(Array.from({ length: n }, (_, i) => i));
    const perTurn = new Map<number, number>();
    for (const [, turn] of log) perTurn.set(turn, (perTurn.get(turn) ?? 0) + 1);
    expect(Math.max(...perTurn.values())).toBe(READERS_WOKEN_PER_TURN);
    expect(perTurn.size).toBe(4); // four turns of the loop, each after the loop's I/O (the first at once)
  });

  it('wakes a reader queued twice once, and passes over one that no longer waits', async () => {
    await settle();
    const t = ticker();
    const log: Array<[number, number]> = [];
    const rs = Array.from({ length: READERS_WOKEN_PER_TURN + 2 }, (_, i) => reader(log, i, t));
    for (const r of rs) wakeReader(r);
    wakeReader(rs.at(-1)!); // queued already
    rs.at(-2)!.wake = undefined; // it ran meanwhile and read its events without waiting
    await settle();
    t.ticking = false;
    expect(log.map(([i]) => i)).toEqual([...Array.from({ length: READERS_WOKEN_PER_TURN }, (_, i) => i), READERS_WOKEN_PER_TURN + 1]);
  });

  it('wakes a lone reader at once in every turn', async () => {
    await settle();
    const t = ticker();
    const log: Array<[number, number]> = [];
    const r = reader(log, 0, t);
    for (let k = 0; k < 3; k++) {
      r.wake = () => log.push([k, t.turn]);
      wakeReader(r);
      expect(log.length).toBe(k + 1);
      await new Promise((res) => setImmediate(res));
    }
    t.ticking = false;
  });
});
