import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fileURLToPath } from 'node:url';
import { ApiError } from '../../errors.js';
import { log } from '../../log.js';
import { registry } from '../../metrics.js';
import type { GenerateEvent } from '../engine-api.js';
import { Engine } from './engine.js';

// The engine on the converter's default models, written into a temp dir:
// cloudgate/random-llama-chat (seeded random weights, fp32 KV) always, and
// cloudgate/stories260k (real weights, so greedy text varies with the prompt)
// when ../shared/models is there. Skipped when the converter is absent.

type Ensure = (o: { modelsDir: string }) => unknown;
const converter = (await import('../convert/default-models.js').catch(() => undefined)) as { ensureDefaultModels?: Ensure } | undefined;
const modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-engine-'));
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const SHARED = path.resolve(process.env.SHARED_MODELS_DIR ?? path.join(repo, '../shared/models'));
const HAVE_STORIES = fs.existsSync(path.join(SHARED, 'stories260K', 'stories260K.bin'));
log.level = 'warn';
let engine: Engine;
let small: Engine;

const RANDOM = 'cloudgate/random-llama-chat';
const STORIES = 'cloudgate/stories260k';
let CHAT = RANDOM;
let EVAL = 'cloudgate/random-llama-eval';

async function collect(it: AsyncGenerator<GenerateEvent>): Promise<{ ids: number[]; text: string; deltas: string[]; done: Extract<GenerateEvent, { type: 'done' }> }> {
  const ids: number[] = [];
  const deltas: string[] = [];
  for await (const ev of it) {
    if (ev.type === 'delta') {
      ids.push(...ev.tokenIds);
      deltas.push(ev.text);
    } else return { ids, text: deltas.join(''), deltas, done: ev };
  }
  throw new Error('stream ended without a done event');
}

async function metricValue(name: string, model: string): Promise<number> {
  const m = await registry.getSingleMetric(name)!.get();
  return m.values.find((v) => v.labels.model === model)?.value ?? 0;
}

const until = async (cond: () => boolean | Promise<boolean>, ms = 2000) => {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error('condition not reached');
    await new Promise((r) => setTimeout(r, 2));
  }
};

describe.skipIf(!converter?.ensureDefaultModels)('engine on the default models', () => {
  beforeAll(async () => {
    converter!.ensureDefaultModels!({ modelsDir });
    engine = await Engine.load({ modelsDir, executionProvider: 'cpu', intraOpThreads: 1, options: { batchSizeMax: 32 } });
    small = await Engine.load({
      modelsDir,
      intraOpThreads: 1,
      options: { batchSizeMax: 1, queueDepthMax: 1, pendingTokensMax: 4, prefillTokensPerStepMax: 16 },
    });
    if (engine.model(STORIES)) {
      CHAT = STORIES;
      EVAL = 'cloudgate/stories260k-eval';
    }
  }, 60_000);
  afterAll(async () => {
    await engine?.close();
    await small?.close();
    fs.rmSync(modelsDir, { recursive: true, force: true });
  });

  const prompt = (i: number, model = CHAT) => engine.encodeChat(model, [{ role: 'user', content: `Once upon a time ${i} ${'there was a dog '.repeat(i % 7)}` }]);
  const greedy = (e: Engine, model: string, tokens: number[], maxTokens = 16, extra: object = {}) =>
    e.generate(model, { promptTokens: tokens, maxTokens, temperature: 0, topP: 1, stop: [], ...extra });

  it('reads the architecture from the ONNX graph', () => {
    expect(engine.arch(RANDOM)).toMatchObject({ layers: 5, kvHeads: 4, headDim: 8, kvType: 'float32', vocab: 512, multiTokenWithPast: true, provider: 'cpu' });
    expect(engine.model(RANDOM)).toMatchObject({ kind: 'chat', contextLength: 512 });
  });

  it.skipIf(!HAVE_STORIES)('continues stories260K as llama2.c does', async () => {
    const r = await collect(greedy(engine, STORIES, [1, ...engine.encode(STORIES, 'Once upon a time')], 30));
    expect(r.text).toMatch(/^, there was a little girl named Lily\. She loved to play outside in the park/);
  });

  for (const which of ['chat', 'random'] as const) {
    it(`gives the same greedy tokens alone and inside a batch of 16 prompts of mixed lengths (${which})`, async () => {
      const model = which === 'chat' ? CHAT : RANDOM;
      // Mixed prompt lengths and mixed max_tokens: rows join and leave the batch at different steps.
      const prompts = Array.from({ length: 16 }, (_, i) => prompt(i * 3, model));
      const maxOf = (i: number) => 8 + ((i * 5) % 17);
      const alone: number[][] = [];
      for (let i = 0; i < 16; i++) alone.push((await collect(greedy(engine, model, prompts[i]!, maxOf(i)))).ids);
      engine.stats(model, true);
      const together = await Promise.all(prompts.map((p, i) => collect(greedy(engine, model, p, maxOf(i)))));
      const st = engine.stats(model, true);
      expect(st.modes.reuse).toBeGreaterThan(0); // steady steps fed the present tensors back
      expect(st.modes.rebuild).toBeGreaterThan(0); // rows left at different steps
      expect(st.rows / st.steps).toBeGreaterThan(4); // really batched
      for (let i = 0; i < 16; i++) expect(together[i]!.ids, `prompt ${i}`).toEqual(alone[i]);
      expect(new Set(prompts.map((p) => p.length)).size).toBeGreaterThan(4);
      if (which === 'chat' && model === STORIES) expect(new Set(alone.map((a) => a.join(','))).size).toBeGreaterThan(4);
    }, 30_000);
  }

  it('lets a sequence join a running batch and decode the same tokens', async () => {
    const ref = (await collect(greedy(engine, CHAT, prompt(11), 24))).ids;
    const refLong = (await collect(greedy(engine, CHAT, prompt(2), 60))).ids;
    const running = Array.from({ length: 4 }, (_, i) => greedy(engine, CHAT, prompt(i + 1), 60));
    const firsts = await Promise.all(running.map((r) => r.next())); // all four are decoding now
    engine.stats(CHAT, true);
    const joined = collect(greedy(engine, CHAT, prompt(11), 24));
    const rest = await Promise.all(running.map((r) => collect(r)));
    const st = engine.stats(CHAT, true);
    expect(st.modes.side).toBe(1); // the newcomer's prefill ran beside the decoding batch
    expect(st.modes.rebuild).toBeGreaterThanOrEqual(2); // it joined, later it left
    expect((await joined).ids).toEqual(ref);
    const long = [...(firsts[1]!.value as { tokenIds: number[] }).tokenIds, ...rest[1]!.ids];
    expect(long).toEqual(refLong);
  }, 30_000);

  it('frees the slot of a stream its reader leaves, before the next step', async () => {
    const it = greedy(engine, CHAT, prompt(1), 400);
    let n = 0;
    for await (const ev of it) if (ev.type === 'delta' && ++n === 3) break;
    expect(engine.load(CHAT).running).toBe(0);
    expect(await metricValue('engine_running_sequences', CHAT)).toBe(0);
  });

  it('cancels on abort: a final cancelled event, the slot freed, usage of what ran', async () => {
    const ac = new AbortController();
    let usage: { promptTokens: number; completionTokens: number } | undefined;
    const p = prompt(2);
    const it = greedy(engine, CHAT, p, 400, { signal: ac.signal, onEnd: (u: typeof usage) => (usage = u) });
    await it.next();
    await it.next();
    ac.abort();
    const events: GenerateEvent[] = [];
    for await (const ev of it) events.push(ev);
    const done = events.at(-1) as Extract<GenerateEvent, { type: 'done' }>;
    expect(done).toMatchObject({ type: 'done', finishReason: 'cancelled', promptTokens: p.length });
    expect(usage).toEqual({ promptTokens: done.promptTokens, completionTokens: done.completionTokens });
    expect(done.completionTokens).toBeGreaterThanOrEqual(2);
    expect(engine.load(CHAT).running).toBe(0);
    await until(async () => (await metricValue('engine_running_sequences', CHAT)) === 0);
    // aborted before the first read, and closed before the first read
    const ac2 = new AbortController();
    const it2 = greedy(engine, CHAT, p, 400, { signal: ac2.signal });
    ac2.abort();
    expect((await collect(it2)).done.finishReason).toBe('cancelled');
    await greedy(engine, CHAT, p, 400).return(undefined);
    expect(engine.load(CHAT)).toEqual({ running: 0, waiting: 0 });
  });

  it('reproduces a sampled completion with the same seed, also inside a batch', async () => {
    const s = (seed: number) => engine.generate(CHAT, { promptTokens: prompt(3), maxTokens: 20, temperature: 1, topP: 0.9, seed, stop: [] });
    const a = await collect(s(7));
    const [b, , c] = await Promise.all([collect(s(7)), collect(greedy(engine, CHAT, prompt(5), 30)), collect(s(8)), collect(s(9))]);
    expect(b.ids).toEqual(a.ids);
    expect(c.ids).not.toEqual(a.ids);
  });

  it('stops before a stop string that spans token boundaries and never emits it', async () => {
    const full = await collect(greedy(engine, CHAT, prompt(4), 40));
    // A stop string from the middle of one token's text into the next one's.
    let stop = '';
    for (let i = 0, pos = 0; i < full.deltas.length - 1; pos += full.deltas[i]!.length, i++) {
      const [a, b] = [full.deltas[i]!, full.deltas[i + 1]!];
      if (i >= 2 && a.length >= 2 && b.length >= 2) {
        stop = full.text.slice(pos + 1, pos + a.length + 1);
        break;
      }
    }
    expect(stop.length).toBeGreaterThan(1);
    const first = full.text.indexOf(stop);
    const r = await collect(greedy(engine, CHAT, prompt(4), 40, { stop: [stop, 'never-in-output'] }));
    expect(r.text).toBe(full.text.slice(0, first));
    expect(r.done.finishReason).toBe('stop');
    for (const d of r.deltas) expect(d.includes(stop)).toBe(false);
    expect(r.ids).toEqual(full.ids.slice(0, r.ids.length)); // the tokens up to the stop, no more
  });

  it('refuses a prompt plus max_tokens over the context length', () => {
    const err = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return e as ApiError;
      }
      throw new Error('no error');
    };
    const e1 = err(() => greedy(engine, CHAT, Array.from({ length: 500 }, () => 5), 20));
    expect(e1).toBeInstanceOf(ApiError);
    expect(e1).toMatchObject({ kind: 'invalid', code: 'context_length_exceeded', param: 'max_tokens' });
    expect(err(() => greedy(engine, CHAT, Array.from({ length: 512 }, () => 5), 1))).toMatchObject({ code: 'context_length_exceeded', param: 'messages' });
    expect(err(() => greedy(engine, CHAT, [1, 99999], 1))).toMatchObject({ kind: 'invalid' });
  });

  it('answers overloaded when the waiting queue is full', async () => {
    const p = prompt(1);
    const first = collect(greedy(small, CHAT, p, 40));
    const second = collect(greedy(small, CHAT, p, 2));
    const e = (() => {
      try {
        greedy(small, CHAT, p, 2);
      } catch (x) {
        return x as ApiError;
      }
    })();
    expect(e).toMatchObject({ kind: 'overloaded' });
    expect(e!.retryAfterMs).toBeGreaterThan(0);
    await Promise.all([first, second]);
  });

  it('pauses a stream whose reader falls behind, keeping its KV, and resumes it', async () => {
    const ref = await collect(greedy(engine, CHAT, prompt(6), 40));
    const before = await metricValue('engine_generated_tokens_total', CHAT);
    const it = greedy(small, CHAT, prompt(6), 40);
    await new Promise((r) => setTimeout(r, 150)); // nobody reads
    const made = (await metricValue('engine_generated_tokens_total', CHAT)) - before;
    expect(made).toBeGreaterThanOrEqual(4);
    expect(made).toBeLessThanOrEqual(4 + 2); // pendingTokensMax, plus the one in flight
    const r = await collect(it);
    expect(r.ids).toEqual(ref.ids);
  });

  it('chunks a long prompt under the prefill budget with the same result', async () => {
    const p = prompt(20);
    expect(p.length).toBeGreaterThan(40);
    const ref = await collect(greedy(engine, CHAT, p, 12));
    const chunked = await collect(greedy(small, CHAT, p, 12)); // prefillTokensPerStepMax 16
    expect(chunked.ids).toEqual(ref.ids);
  });

  const maxDiff = (x: Float32Array, y: Float32Array) => {
    let m = 0;
    for (let t = 0; t < x.length; t++) m = Math.max(m, Math.abs(x[t]! - y[t]!));
    return m;
  };

  it('scores branches from one prefill of the prefix as if each ran from scratch, counting the prefix once', async () => {
    const prefix = [1, ...engine.encode(EVAL, 'The state of the world is calm today.')];
    const branches = [engine.encode(EVAL, ' Is it calm? Answer:'), engine.encode(EVAL, ' Is it loud?'), [5], engine.encode(EVAL, ' Yes')];
    const promptsBefore = await metricValue('engine_prompt_tokens_total', EVAL);
    const shared = await engine.scoreBranches(EVAL, { prefixTokens: prefix, branches });
    const total = prefix.length + branches.reduce((s, b) => s + b.length, 0);
    expect(shared.processedTokens).toBe(total);
    expect((await metricValue('engine_prompt_tokens_total', EVAL)) - promptsBefore).toBe(total); // the prefix ran once
    for (let i = 0; i < branches.length; i++) {
      const alone = await engine.scoreBranches(EVAL, { prefixTokens: [], branches: [[...prefix, ...branches[i]!]] });
      expect(shared.logprobs[i]!.length).toBe(512);
      expect(maxDiff(shared.logprobs[i]!, alone.logprobs[0]!)).toBeLessThan(1e-4);
      let sum = 0;
      for (const x of shared.logprobs[i]!) sum += Math.exp(x);
      expect(sum).toBeCloseTo(1, 4);
    }
  });

  it('scores nested branches (a branch continuing another) next to chat traffic', async () => {
    const prefix = [1, ...engine.encode(EVAL, 'Tom has a red ball.')];
    const q = engine.encode(EVAL, ' Is the ball red? A:');
    const branches = [
      { parent: -1, tokens: q },
      { parent: 0, tokens: engine.encode(EVAL, ' yes') },
      { parent: 0, tokens: engine.encode(EVAL, ' no') },
      { parent: 1, tokens: [13] },
    ];
    const chat = collect(greedy(engine, CHAT, prompt(9), 30));
    const shared = await engine.scoreBranches(EVAL, { prefixTokens: prefix, branches });
    await chat;
    const path = (i: number): number[] => (i < 0 ? prefix : [...path(branches[i]!.parent), ...branches[i]!.tokens]);
    expect(shared.processedTokens).toBe(prefix.length + branches.reduce((s, b) => s + b.tokens.length, 0));
    for (let i = 0; i < branches.length; i++) {
      const alone = await engine.scoreBranches(EVAL, { prefixTokens: [], branches: [path(i)] });
      expect(maxDiff(shared.logprobs[i]!, alone.logprobs[0]!)).toBeLessThan(1e-4);
    }
  });

  it('rejects a cancelled evaluation and bad branch trees', async () => {
    const ac = new AbortController();
    const p = engine.scoreBranches(EVAL, { prefixTokens: prompt(3, EVAL), branches: [[5], [6]], signal: ac.signal });
    ac.abort();
    await expect(p).rejects.toBeInstanceOf(ApiError);
    await expect(engine.scoreBranches(EVAL, { prefixTokens: [1], branches: [{ parent: 0, tokens: [5] }] })).rejects.toMatchObject({ kind: 'invalid' });
    await expect(engine.scoreBranches(EVAL, { prefixTokens: Array.from({ length: 510 }, () => 5), branches: [[5, 5, 5]] })).rejects.toMatchObject({
      code: 'context_length_exceeded',
    });
    expect(engine.load(EVAL)).toEqual({ running: 0, waiting: 0 });
  });
});
