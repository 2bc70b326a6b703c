import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { endHeldThreads, exitUnderway, holdExitFor } from './threads-at-exit.js';

// A thread that runs until told to end, as a model worker does: it ends itself on 'end'.
const UNTIL_TOLD = `
const { parentPort } = require('node:worker_threads');
const busy = setInterval(() => {}, 1000);
parentPort.on('message', (m) => { if (m === 'end') { clearInterval(busy); process.exit(0); } });
`;

function held(): { w: Worker; asked: () => number; ended: Promise<number> } {
  const w = new Worker(UNTIL_TOLD, { eval: true });
  let asked = 0;
  holdExitFor(w, () => {
    asked++;
    w.postMessage('end');
  });
  return { w, asked: () => asked, ended: new Promise((r) => w.once('exit', r)) };
}

describe('threads held at exit', () => {
  it('asks each held thread to end itself, waits for all, and refuses none later', async () => {
    const a = held();
    const b = held();
    const gone = held();
    gone.w.postMessage('end'); // one that ended on its own is no longer waited for
    await gone.ended;
    expect(exitUnderway()).toBe(false);
    await endHeldThreads();
    expect(exitUnderway()).toBe(true);
    expect([a.asked(), b.asked(), gone.asked()]).toEqual([1, 1, 0]);
    expect(await Promise.all([a.ended, b.ended])).toEqual([0, 0]);
    // One started while the process exits is asked at once.
    const late = held();
    expect(late.asked()).toBe(1);
    expect(await late.ended).toBe(0);
  });
});
