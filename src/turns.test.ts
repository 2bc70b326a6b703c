import { describe, expect, it } from 'vitest';
import { takeTurn } from './turns.js';

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
