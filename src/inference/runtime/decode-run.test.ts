import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateModel } from '../convert/convert.js';
import { SLOW_STEP_TEST_SHAPE } from '../../../test/test-models.js';
import { Engine } from './engine.js';
import type { SamplerSpec } from './protocol.js';
import type { Runner } from './runner.js';

// A decode run (worker.ts) seen from the runner, driven directly with sequence ids of the
// test's own. When a prompt that joins it gets its step, counted in the run's own steps: the
// worker reads its commands between two steps, so a prompt sent while a step runs is run before
// the next one, and one sent while a run waits to begin is run at its first. And a generation
// that ends inside a run gives its slot back at once. A close ends a run after its first step.

const MODEL = 'test/decode-run';
const modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-decode-run-'));
let engine: Engine;
let runner: Runner;
const prompt = Array.from({ length: 12 }, (_, i) => 3 + i * 7);
/** A prompt step long beside the messages sent after it, which wait behind it in the worker. */
const longPrompt = Array.from({ length: 300 }, (_, i) => prompt[i % prompt.length]!);

beforeAll(async () => {
  // Its ~1 ms steps are long beside the worker's code between two steps, so a prompt sent at a
  // random moment arrives while a step runs.
  generateModel(SLOW_STEP_TEST_SHAPE, path.join(modelsDir, 'decode-run'), { id: MODEL, kind: 'chat' });
  engine = await Engine.load({ modelsDir, executionProvider: 'cpu', strict: false, intraOpThreads: 1 });
  runner = (engine as unknown as { models: Map<string, { runners: Runner[] }> }).models.get(MODEL)!.runners[0]!;
}, 60_000);
afterAll(async () => {
  await engine?.close();
  fs.rmSync(modelsDir, { recursive: true, force: true });
});

/** Greedy, no end of text: a sequence goes on until its budget or an interrupt. */
const sampler = (budget: number): SamplerSpec => ({ temperature: 0, topP: 1, seed: 1, budget, eos: [] });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/**
 * Time for the worker to take up a prompt step sent just before (a message and a turn), and well
 * within the ~300-token step's own time. Where the step has not begun by then (a loaded machine),
 * the worker takes the messages in one turn and the tests below pass without meeting the race
 * they guard: they can miss it, not fail for it.
 */
const LONG_STEP_BEGUN_MS = 5;

describe('a decode run', () => {
  it('runs a prompt sent while a step runs before the next step', async () => {
    await runner.join([{ seq: 1, tokens: prompt, sampler: sampler(400) }]);
    const madeAt: number[] = [];
    const run = runner.decode([1], 400, (_seqs, _tokens, _lps, at) => madeAt.push(at));
    while (madeAt.length < 4) await sleep(1);
    // Each join's answer comes after the tokens of every step made before it (the worker posts them first).
    const stepsBefore: number[] = [];
    for (let k = 0; k < 8; k++) {
      await sleep(1 + (k % 3));
      const answered = runner.join([{ seq: 10 + k, tokens: prompt, sampler: sampler(400) }]);
      const sentAt = performance.now(); // the join is posted by now (Runner.call posts before its first await); madeAt is on this clock
      await answered;
      stepsBefore.push(madeAt.filter((t) => t > sentAt).length);
    }
    runner.interrupt();
    await run;
    runner.free([1, ...Array.from({ length: 8 }, (_, k) => 10 + k)]);
    // The step in flight when it was sent finishes first, and then the prompt runs. Read only
    // when the loop next polled, just before the next step's run, it waited for that step too (2).
    expect(Math.max(...stepsBefore), `steps made between each join's send and its answer: ${stepsBefore}`).toBeLessThanOrEqual(1);
  }, 60_000);

  it('runs a prompt sent while a decode run waits behind a step at that run\'s first step', async () => {
    await runner.join([{ seq: 20, tokens: prompt, sampler: sampler(50) }]);
    let steps = 0;
    // A long prompt step first, so the decode run and the join below wait behind it in the worker.
    // Sent once the step has begun, they come while its run holds the worker's thread: the event
    // loop would read the join only once the decode run's first step had started.
    const before = runner.step([{ seq: 21, tokens: longPrompt }]);
    await sleep(LONG_STEP_BEGUN_MS);
    const run = runner.decode([20], 50, () => steps++);
    const joined = runner.join([{ seq: 22, tokens: prompt, sampler: sampler(50) }]).then(() => steps);
    await before;
    const stepsBeforeJoin = await joined;
    await run;
    // Freed before the check, so that a failure here leaves the next tests a worker holding nothing.
    runner.free([20, 21, 22]);
    // It ran at the run's first step: answered before any of the run's tokens came.
    expect(stepsBeforeJoin).toBe(0);
  }, 60_000);

  it('ends a run interrupted while it waited behind other work after its first step', async () => {
    await runner.join([{ seq: 40, tokens: prompt, sampler: sampler(50) }]);
    let steps = 0;
    const before = runner.step([{ seq: 41, tokens: longPrompt }]); // the run waits behind this step
    const run = runner.decode([40], 50, (seqs) => void (steps += seqs.length));
    runner.interrupt(); // before the run began: once reset when it did, and the run went on to its 50 steps
    await Promise.all([before, run]);
    runner.free([40, 41]);
    expect(steps).toBe(1);
  }, 60_000);

  it('frees the slot of a generation that ends inside a run at once, not when the scheduler frees it after the run', async () => {
    await runner.join([{ seq: 30, tokens: prompt, sampler: sampler(3) }, { seq: 31, tokens: prompt, sampler: sampler(40) }]);
    // The sequences each worker holds, as it publishes them to the others (peers.ts).
    const share = (runner as unknown as { init: { peers: { live: Int32Array; index: number } } }).init.peers;
    const made = new Map<number, number>();
    const liveAfterEnd: number[] = [];
    await runner.decode([30, 31], 64, (seqs) => {
      for (const seq of seqs) made.set(seq, (made.get(seq) ?? 0) + 1);
      // Sequence 30 made its last token (its third, the first came with the prompt) a few steps ago.
      if ((made.get(31) ?? 0) > 5) liveAfterEnd.push(Atomics.load(share.live, share.index));
    });
    expect(made.get(30)).toBe(2);
    expect(liveAfterEnd.length).toBeGreaterThan(0);
    // One held while sequence 31 goes on (none once it ends too): 30's slot went when it ended.
    expect(Math.max(...liveAfterEnd)).toBe(1);
    runner.free([30, 31]); // finds sequence 30 gone already: no error
    await runner.join([{ seq: 32, tokens: prompt, sampler: sampler(2) }]); // the worker goes on
    runner.free([32]);
  }, 60_000);

  // Last: it closes the runner.
  it('makes the first step of a run that a close reached before the run began, then ends it', async () => {
    await runner.join([{ seq: 50, tokens: prompt, sampler: sampler(50) }]);
    let steps = 0;
    // As above: the run and the close come while the prompt step before them holds the thread, so
    // the run reads the close before its first step. A run of no step is a fault to the scheduler.
    const before = runner.step([{ seq: 51, tokens: longPrompt }]);
    await sleep(LONG_STEP_BEGUN_MS);
    const run = runner.decode([50], 50, (seqs) => void (steps += seqs.length));
    await Promise.all([before, run, runner.close()]);
    expect(steps).toBe(1);
  }, 60_000);
});
