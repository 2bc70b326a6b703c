import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registries } from '../../metrics.js';
import type { GenerateEvent } from '../engine-api.js';
import { ensureDefaultModels } from '../convert/default-models.js';
import { Engine } from './engine.js';
import type { Runner } from './runner.js';

// Issue 12.7: a worker that dies fails its requests as failures (not as cancellations),
// comes back without a daemon restart, and is counted.

const CHAT = 'cloudgate/random-llama-chat';
const modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-restart-'));
let engine: Engine;
beforeAll(async () => {
  ensureDefaultModels({ modelsDir });
  engine = await Engine.load({ modelsDir, executionProvider: 'cpu', strict: false, intraOpThreads: 1 });
}, 60_000);
afterAll(async () => {
  await engine?.close();
  fs.rmSync(modelsDir, { recursive: true, force: true });
});

const runnerOf = (id: string): Runner => (engine as unknown as { models: Map<string, { runners: Runner[] }> }).models.get(id)!.runners[0]!;
const restarts = async () => (await registries.inference.getSingleMetric('cloudgate_engine_worker_restarts_total')!.get()).values.find((v) => v.labels.model_name === CHAT)?.value ?? 0;

async function run(prompt: number[], maxTokens: number, onFirst?: () => void): Promise<{ ids: number[]; done: Extract<GenerateEvent, { type: 'done' }> }> {
  const ids: number[] = [];
  for await (const ev of engine.generate(CHAT, { promptTokens: prompt, maxTokens, temperature: 0, topP: 1, stop: [] })) {
    if (ev.type === 'done') return { ids, done: ev };
    if (ids.length === 0 && ev.tokenIds.length) onFirst?.();
    ids.push(...ev.tokenIds);
  }
  throw new Error('no done event');
}

describe('model worker crash', () => {
  it('fails the generations in flight as failed, restarts the worker, and serves the same tokens after', async () => {
    const prompt = await engine.encodeChat(CHAT, [{ role: 'user', content: 'Once upon a time' }]);
    const before = await run(prompt, 24);
    const counted = await restarts();
    const crashed = await run(prompt, 400, () => void runnerOf(CHAT).crashForTest());
    expect(crashed.done.finishReason).toBe('failed');
    expect(crashed.done.failure).toMatchObject({ retryable: true });
    expect(crashed.done.failure!.message).toMatch(/restarting/);
    expect(crashed.ids.length).toBeLessThan(400);
    // Calls made while it restarts wait for it: the next generation is whole and the same.
    const after = await run(prompt, 24);
    expect(after.done.finishReason).toBe('length');
    expect(after.ids).toEqual(before.ids);
    expect(await restarts()).toBe(counted + 1);
    expect(runnerOf(CHAT).alive).toBe(true);
  }, 60_000);

  it("drops the evaluation states it kept with the worker's caches: the same user's next request after a restart prefills its state again", async () => {
    const EVAL = 'cloudgate/random-llama-eval';
    const prefix = await engine.encode(EVAL, 'The lake was cold and the boats were tied up for the night.');
    const q = await engine.encode(EVAL, ' Is it late?');
    const score = () => engine.scoreBranches(EVAL, { prefixTokens: prefix, branches: [{ parent: -1, tokens: q }], shareScope: 'u' });
    const hits = async () => (await registries.inference.getSingleMetric('vllm:prefix_cache_hits_total')!.get()).values.find((v) => v.labels.model_name === EVAL)?.value ?? 0;
    const before = await score(); // kept
    const hits0 = await hits();
    const restarted = async () => (await registries.inference.getSingleMetric('cloudgate_engine_worker_restarts_total')!.get()).values.find((v) => v.labels.model_name === EVAL)?.value ?? 0;
    const counted = await restarted();
    runnerOf(EVAL).crashForTest();
    while ((await restarted()) === counted) await new Promise((r) => setTimeout(r, 10));
    const after = await score(); // runs its state again, not a fork of a cache that went with the worker
    expect(await hits()).toBe(hits0);
    expect(after.logprobs[0]).toEqual(before.logprobs[0]);
    expect(runnerOf(EVAL).alive).toBe(true);
  }, 60_000);

  it("drops the chat generations it kept with the worker's caches: a conversation's next turn after a restart runs its whole prompt", async () => {
    const prompt = await engine.encodeChat(CHAT, [{ role: 'user', content: 'The fox ran over the hill and into the wood.' }]);
    const hits = async () => (await registries.inference.getSingleMetric('vllm:prefix_cache_hits_total')!.get()).values.find((v) => v.labels.model_name === CHAT)?.value ?? 0;
    const turn = async (tokens: number[]) => {
      for await (const ev of engine.generate(CHAT, { promptTokens: tokens, maxTokens: 8, temperature: 0, topP: 1, stop: [], shareScope: 'u' })) if (ev.type === 'done') return ev;
      throw new Error('no done event');
    };
    await turn(prompt); // kept
    const next = [...prompt, 5, 6, 7];
    const counted = await restarts();
    runnerOf(CHAT).crashForTest();
    while ((await restarts()) === counted) await new Promise((r) => setTimeout(r, 10));
    const hits0 = await hits();
    const after = await turn(next);
    expect(after.finishReason).toBe('length');
    expect(after.usage.cachedInputTokens).toBeUndefined();
    expect(await hits()).toBe(hits0);
    // Kept again on the new worker: the turn after starts from it.
    expect((await turn([...next, 8, 9])).usage.cachedInputTokens).toBeGreaterThanOrEqual(next.length);
  }, 60_000);
});
