import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { GenerateEvent } from '../engine-api.js';
import { ensureDefaultModels } from '../convert/default-models.js';
import { Engine } from './engine.js';
import type { Runner } from './runner.js';

// A shutdown closes the engine while generations run and the schedulers still send work. The
// worker used to be terminate()d from outside: landing inside an onnxruntime call, that aborted
// the whole daemon (SIGABRT, 'Napi::Error'; CI saw it at a shutdown). It now ends its own thread
// between two calls; this process surviving the closes below is half of the check.

const CHAT = 'cloudgate/random-llama-chat';
/** Most of its 512-position context: a run far longer than the closes below wait. */
const MAX_TOKENS = 480;
const modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-close-'));
beforeAll(() => ensureDefaultModels({ modelsDir }), 60_000);
afterAll(() => fs.rmSync(modelsDir, { recursive: true, force: true }));

const workerOf = (e: Engine): unknown => (e as unknown as { models: Map<string, { runners: Runner[] }> }).models.get(CHAT)!.runners[0]!['worker' as keyof Runner];

async function run(engine: Engine, prompt: number[], onFirst?: () => void): Promise<{ tokens: number; done: Extract<GenerateEvent, { type: 'done' }> }> {
  let tokens = 0;
  for await (const ev of engine.generate(CHAT, { promptTokens: prompt, maxTokens: MAX_TOKENS, temperature: 0, topP: 1, stop: [] })) {
    if (ev.type === 'done') return { tokens, done: ev };
    if (tokens === 0 && ev.tokenIds.length) onFirst?.();
    tokens += ev.tokenIds.length;
  }
  throw new Error('no done event');
}

describe('closing the engine', () => {
  // Three closes, each at a different point of a decode run, with a second generation
  // queued behind the first: each close meets a worker in the middle of its steps.
  it.each([0, 5, 20])('mid-run (close %i ms after the first token): generations end as shutting down, the worker thread ends, the process lives', async (delayMs) => {
    const engine = await Engine.load({ modelsDir, executionProvider: 'cpu', strict: false, intraOpThreads: 1 });
    const prompt = await engine.encodeChat(CHAT, [{ role: 'user', content: 'Once upon a time' }]);
    let closed: Promise<void> | undefined;
    const first = run(engine, prompt, () => void setTimeout(() => (closed = engine.close()), delayMs));
    const second = run(engine, prompt);
    const [a, b] = await Promise.all([first, second]);
    await closed;
    for (const r of [a, b]) {
      expect(r.done.finishReason).toBe('failed');
      expect(r.done.failure).toMatchObject({ retryable: true, shuttingDown: true });
      expect(r.done.failure!.message).toMatch(/shutting down/);
      expect(r.tokens).toBeLessThan(MAX_TOKENS);
    }
    expect(workerOf(engine)).toBeUndefined();
    // After the close: told at once, the same way, and nothing reaches the gone worker.
    const late = await run(engine, prompt);
    expect(late.done.failure).toMatchObject({ shuttingDown: true });
    expect(late.tokens).toBe(0);
    await engine.close(); // a second close is a no-op, not a hang
  }, 60_000);
});
