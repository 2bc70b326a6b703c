import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { registries } from '../../metrics.js';
import { ensureDefaultModels } from '../convert/default-models.js';
import { defaultEngineOptions } from './options.js';
import type { StepRow } from './protocol.js';
import type { OnTokens, Runner } from './runner.js';
import { Scheduler } from './scheduler.js';
import { ModelText } from './text.js';

// The scheduler's choice of rows, step by step, against a runner that does no
// model work and runs each step only when the test lets it.

const modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-sched-'));
afterAll(() => fs.rmSync(modelsDir, { recursive: true, force: true }));

const V = 8;

function gatedRunner() {
  const steps: StepRow[][] = [];
  const gates: Array<() => void> = [];
  const runner = {
    arch: { vocab: V },
    alive: true,
    labels: { model: 'm', replica: 0 },
    kvBytes: 0,
    async step(rows: StepRow[]) {
      steps.push(rows);
      await new Promise<void>((r) => gates.push(r));
      // Every generation ends on its first token (2 is the end of text).
      return { logits: new Float32Array(rows.length * V), tokens: Int32Array.from(rows, (r) => (r.sampler ? 2 : -1)) };
    },
    async fork() {},
    free() {},
    keep() {},
    interrupt() {},
    async decode() {},
  };
  /** Lets the oldest waiting step finish, once one is waiting. */
  const release = async () => {
    while (!gates.length) await new Promise((r) => setImmediate(r));
    gates.shift()!();
  };
  return { runner: runner as unknown as Runner, steps, release };
}

describe('scheduler', () => {
  it('steps one evaluation’s branches alone, and lets a waiting prompt in between two evaluations’ branch steps', async () => {
    ensureDefaultModels({ modelsDir, sharedModelsDir: path.join(modelsDir, 'none') });
    const text = new ModelText(path.join(modelsDir, 'random-llama'));
    const { runner, steps, release } = gatedRunner();
    const s = new Scheduler('m', runner, text, defaultEngineOptions, 512);
    const branches = [
      { parent: -1, tokens: [5, 6] },
      { parent: -1, tokens: [7, 8, 9] },
    ];
    const a = s.scoreBranches([1, 3, 4], branches);
    const b = s.scoreBranches([1, 3, 4, 4], branches);
    await release(); // both prefixes in one step
    const chat = s.generate({ promptTokens: [1, 10, 11, 12, 13, 14, 15, 16], maxTokens: 4, temperature: 0, topP: 1, stop: [] });
    const first = chat.next();
    for (let i = 0; i < 3; i++) await release();
    await Promise.all([a, b, first]);
    const kinds = steps.map((rows) => rows.map((r) => r.tokens.length).join(','));
    // prefixes; one evaluation's two branches; the chat prompt; the other evaluation's branches
    expect(kinds).toEqual(['3,4', '2,3', '8', '2,3']);
    await chat.return(undefined);
  });

  it('sends a prompt into an idle model before generate returns, and prompts into a busy one together a turn later', async () => {
    ensureDefaultModels({ modelsDir, sharedModelsDir: path.join(modelsDir, 'none') });
    const text = new ModelText(path.join(modelsDir, 'random-llama'));
    const { runner, steps, release } = gatedRunner();
    const s = new Scheduler('m', runner, text, defaultEngineOptions, 512);
    const req = (promptTokens: number[]) => s.generate({ promptTokens, maxTokens: 4, temperature: 0, topP: 1, stop: [] });
    const lone = req([1, 10, 11]);
    expect(steps.map((rows) => rows.length)).toEqual([1]);
    // While it runs, two more arrive in one turn: they wait for the loop, and share its next step.
    const two = [req([1, 12]), req([1, 13, 14, 15])];
    expect(steps).toHaveLength(1);
    const firsts = [lone, ...two].map((g) => g.next());
    await release();
    await release();
    await Promise.all(firsts);
    expect(steps.map((rows) => rows.map((r) => r.tokens.length).join(','))).toEqual(['3', '2,4']);
    for (const g of [lone, ...two]) await g.return(undefined);
  });

  it('ends a decode run planned without a prompt whose join came back only after the run it was sent to had ended, so the next run takes it', async () => {
    ensureDefaultModels({ modelsDir, sharedModelsDir: path.join(modelsDir, 'none') });
    const text = new ModelText(path.join(modelsDir, 'random-llama'));
    // Runs and joins end when the test says (a run after one step of the sequences it was sent); every token is 5 (not the end of text).
    const runs: Array<{ seqs: number[]; end: () => void }> = [];
    const joins: Array<() => void> = [];
    let interrupts = 0;
    const answer = (rows: StepRow[]) => ({ logits: new Float32Array(rows.length * V), tokens: Int32Array.from(rows, () => 5) });
    const runner = {
      arch: { vocab: V },
      alive: true,
      labels: { model: 'm', replica: 0 },
      kvBytes: 0,
      step: async (rows: StepRow[]) => answer(rows),
      join: (rows: StepRow[]) => new Promise((ok) => joins.push(() => ok(answer(rows)))),
      decode: (seqs: number[], _stepsMax: number, onTokens: OnTokens) =>
        new Promise<void>((done) => runs.push({ seqs, end: () => (onTokens(seqs, Int32Array.from(seqs, () => 5), undefined, performance.now()), done()) })),
      interrupt: () => void interrupts++,
      async fork() {},
      free() {},
      keep() {},
    } as unknown as Runner;
    const s = new Scheduler('m', runner, text, defaultEngineOptions, 512);
    const tick = async (until: () => boolean) => {
      while (!until()) await new Promise((r) => setImmediate(r));
    };
    const req = (promptTokens: number[]) => s.generate({ promptTokens, maxTokens: 40, temperature: 0, topP: 1, stop: [] });
    const a = req([1, 10, 11]);
    const aFirst = a.next();
    await tick(() => runs.length === 1); // its prompt stepped, its decode run in flight
    const b = req([1, 12, 13]);
    const bFirst = b.next();
    await tick(() => joins.length === 1); // sent to join run 1
    runs[0]!.end(); // run 1 ends in the worker before b's prompt came: b runs there alone
    await tick(() => runs.length === 2);
    expect(runs[1]!.seqs).toHaveLength(1); // run 2 planned without b, whose first token is not back
    expect(interrupts).toBe(0);
    joins[0]!();
    await Promise.all([aFirst, bFirst]);
    // b's answer came in run 2, which it is not in: run 2 ends after its step, and run 3 takes b.
    expect(interrupts).toBe(1);
    runs[1]!.end();
    await tick(() => runs.length === 3);
    expect(runs[2]!.seqs).toHaveLength(2);
    await a.return(undefined);
    await b.return(undefined);
    runs[2]!.end();
  });

  it('counts the opening of a start whose generation was gone in the worker (a missed fork, run there) as prompt tokens, as it is billed', async () => {
    ensureDefaultModels({ modelsDir, sharedModelsDir: path.join(modelsDir, 'none') });
    const text = new ModelText(path.join(modelsDir, 'random-llama'));
    // Every token is 5 (not the end of text); a's decode run never ends; a join that starts from
    // another generation finds it gone (worker.ts startFromKept) and runs its opening too.
    const answer = (rows: StepRow[]) => ({ logits: new Float32Array(rows.length * V), tokens: Int32Array.from(rows, () => 5) });
    const runner = {
      arch: { vocab: V, keepsGenerations: true, layers: 1, kvHeads: 1, headDim: 4 },
      alive: true,
      labels: { model: 'missed-fork', replica: 0 },
      kvBytes: 0,
      step: async (rows: StepRow[]) => answer(rows),
      join: async (rows: StepRow[]) => ({ ...answer(rows), missed: rows.filter((r) => r.from).map((r) => r.seq) }),
      decode: () => new Promise<void>(() => {}),
      interrupt() {},
      async fork() {},
      free() {},
      keep() {},
    } as unknown as Runner;
    const s = new Scheduler('missed-fork', runner, text, defaultEngineOptions, 512);
    const prompted = async () => (await registries.inference.getSingleMetric('vllm:prompt_tokens_total')!.get()).values.find((v) => v.labels.model_name === 'missed-fork')?.value ?? 0;
    const opening = Array.from({ length: 40 }, (_, i) => 10 + (i % 7));
    const a = s.generate({ promptTokens: opening, maxTokens: 40, temperature: 0, topP: 1, stop: [], shareScope: 'u' });
    expect((await a.next()).done).toBe(false); // a holds its prompt now: b starts from it
    const before = await prompted();
    const b = s.generate({ promptTokens: [...opening, 5, 6, 7], maxTokens: 1, temperature: 0, topP: 1, stop: [], shareScope: 'u' });
    let usage;
    for await (const ev of b) if (ev.type === 'done') usage = ev.usage;
    expect(usage).toEqual({ inputTokens: 43, outputTokens: 1 }); // nothing taken from a's cache
    expect((await prompted()) - before).toBe(43);
    await a.return(undefined);
  });
});
