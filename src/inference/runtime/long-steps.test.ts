import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { generateCheckpoint } from '../convert/generate.js';
import { buildLlamaOnnx } from '../convert/onnx-writer.js';
import { headSize } from '../convert/llama2c.js';
import { checkedSlotSteps, promptsBesideDecoding, referenceSteps } from '../../../test/reference-steps.js';
import { KvSlots, slotStepDone, slotStepFeeds } from './kv-slots.js';
import { LONG_STEP_QUERY_CHUNKS, longStepGraph } from './long-steps.js';
import { prefillGraph } from './prefill-graph.js';
import { weightTypeHere } from './integer-products.js';
import { generateModel } from '../convert/convert.js';
import { Engine } from './engine.js';
import { registries } from '../../metrics.js';
import type { GenerateEvent } from '../engine-api.js';
import { LONG_SESSION_STEP_TOKENS_MIN } from './session-choice.js';
import type { Runner } from './runner.js';

// The long-step graph (each layer's attention in causal pieces of the queries) driven the way the
// worker drives a slot graph, checked against run.c's forward pass: prompts whose length the pieces
// do not divide, rows of different lengths (left pads) in one step, a chunk over a filled cache,
// decode steps of one token (pieces of nothing but the last), grouped query heads, and the graphs it
// leaves alone.

const TOL = 1e-4;
const shape = (heads: number, kvHeads: number) => ({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: heads, nKvHeads: kvHeads, vocabSize: 64, seqLen: 160, seed: 5, std: 0.3 });
const opTypes = (bytes: Uint8Array) => onnxProto.onnx.ModelProto.decode(bytes).graph!.node!.map((n) => n.opType);

describe('longStepGraph', () => {
  for (const [heads, kvHeads] of [
    [4, 4],
    [8, 4],
    [4, 1],
  ] as const) {
    it(`answers as the slot graph does through prompts in pieces, chunks over a cache and decode steps (${heads} heads, ${kvHeads} kv heads)`, async () => {
      const ck = generateCheckpoint(shape(heads, kvHeads));
      const long = longStepGraph(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model)!;
      expect(long).toBeDefined();
      expect(opTypes(long).filter((t) => t === 'Softmax')).toHaveLength(2 * LONG_STEP_QUERY_CHUNKS);
      const { step, maxErr, tok } = await checkedSlotSteps(ck, long);
      await promptsBesideDecoding(step, tok);
      // 45 tokens: pieces of 12, 12, 12 and 9; beside a row of 3 (left-padded by 42)
      await step([
        { seq: 5, tokens: tok(45, 5) },
        { seq: 1, tokens: tok(3, 9) },
      ]);
      // a chunk over the 45 positions just cached, fewer tokens than pieces, then one token
      await step([{ seq: 5, tokens: tok(3, 6) }]);
      await step([{ seq: 5, tokens: tok(30, 7) }]);
      await step([1, 5].map((seq) => ({ seq, tokens: tok(1, seq) })));
      expect(maxErr()).toBeLessThan(TOL);
    });
  }

  it('rewrites the prefill graph (int8 products) to the same answers', async () => {
    const ck = generateCheckpoint(shape(4, 4));
    const prefill = prefillGraph(buildLlamaOnnx(ck, { kvLayout: 'slots', weights: 'int4' }).model, await weightTypeHere())!;
    const long = longStepGraph(prefill)!;
    const run = async (graph: Uint8Array) => {
      const sess = await ort.InferenceSession.create(graph, { intraOpNumThreads: 1 });
      const sl = new KvSlots({ layers: 2, kvHeads: 4, headDim: headSize(ck.config), positionsMax: 160, emptyCacheFeeds: true });
      const tok = referenceSteps(ck).tok;
      const answers: Float32Array[] = [];
      for (const rows of [[{ seq: 1, tokens: tok(70, 1) }], [{ seq: 1, tokens: tok(50, 2) }]]) {
        const st = slotStepFeeds(sl, rows);
        answers.push(slotStepDone(sl, st, await sess.run(st.feeds)));
      }
      return answers;
    };
    const [want, got] = [await run(prefill), await run(long)];
    for (let s = 0; s < want.length; s++) {
      let diff = 0;
      for (let i = 0; i < want[s]!.length; i++) diff = Math.max(diff, Math.abs(got[s]![i]! - want[s]![i]!));
      expect(diff).toBeLessThan(TOL);
    }
    // The one-piece cores are gone, and with them what only they read (the probabilities' split
    // sizes, the shared floor): every node's answer and every constant is read by something.
    expect(opTypes(long).filter((t) => t === 'Softmax')).toHaveLength(2 * LONG_STEP_QUERY_CHUNKS);
    const g = onnxProto.onnx.ModelProto.decode(long).graph!;
    const read = new Set([...g.node!.flatMap((n) => n.input ?? []), ...g.output!.map((o) => o.name!)]);
    expect(g.node!.flatMap((n) => n.output ?? []).filter((o) => o && !read.has(o))).toEqual([]);
    expect(g.initializer!.map((t) => t.name!).filter((name) => !read.has(name))).toEqual([]);
    // Its new keys and values come out a layer's keys or values each, as the prefill graph gives them (prefill-graph.ts layerOutputs).
    expect(g.output!.map((o) => o.name)).toEqual(['logits', 'new.0.key', 'new.0.value', 'new.1.key', 'new.1.value']);
    expect(opTypes(long).filter((t) => t === 'Identity')).toEqual([]);
  });

  it('leaves alone the graphs whose attention is not the slot form: the past layout', () => {
    expect(longStepGraph(buildLlamaOnnx(generateCheckpoint(shape(4, 4)), { kvLayout: 'past' }).model)).toBeUndefined();
  });
});

describe('an engine with a long-step session (ORT_LONG_STEP_SESSION)', () => {
  it("runs a long prompt's step there, with the same greedy tokens as without it", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-long-'));
    const id = 'test/long-steps';
    generateModel({ dim: 64, hiddenDim: 128, nLayers: 2, nHeads: 4, nKvHeads: 4, vocabSize: 512, seqLen: 1024, seed: 3 }, path.join(dir, 'long'), { id, kind: 'chat', weights: ['int4'] });
    const load = (longSession: boolean) => Engine.load({ modelsDir: dir, executionProvider: 'cpu', strict: false, intraOpThreads: 2, longSession });
    const [withLong, without] = [await load(true), await load(false)];
    const passes = async (threads: string) =>
      (await registries.inference.getSingleMetric('cloudgate_engine_forward_passes_total')!.get()).values
        .filter((v) => v.labels.model_name === id && v.labels.threads === threads)
        .reduce((n, v) => n + v.value, 0);
    const ids = async (e: Engine, promptTokens: number[]) => {
      const out: number[] = [];
      for await (const ev of e.generate(id, { promptTokens, maxTokens: 4, temperature: 0, topP: 1, stop: [], adjust: { bias: [[2, -100]], presence: 0, frequency: 0 } }) as AsyncGenerator<GenerateEvent>) if (ev.type === 'delta') out.push(...ev.tokenIds);
      return out;
    };
    try {
      // Its warm-up ran the longest step there is (the idle step budget, the context: 1,024 tokens) on the long-step session.
      const warmOf = (e: Engine) => (e as unknown as { models: Map<string, { runners: Runner[] }> }).models.get(id)!.runners[0]!.warmPace;
      expect(warmOf(withLong)?.long?.tokens).toBe(1024);
      expect(warmOf(withLong)?.long?.stepMs).toBeGreaterThan(0);
      expect(warmOf(without)?.long).toBeUndefined();
      // One step a prompt of 727 tokens (the idle step budget is 1,024), each on the long-step session.
      for (let i = 0; i < 3; i++) {
        const prompt = Array.from({ length: LONG_SESSION_STEP_TOKENS_MIN + 87 }, (_, j) => 3 + ((j * (i + 5)) % 500));
        expect(await ids(withLong, prompt)).toEqual(await ids(without, prompt));
      }
      // Each a pass there and nowhere else: the sessions of the graph as converted are not measured at that size.
      await expect.poll(() => passes('all_long'), { timeout: 5_000 }).toBe(3);
    } finally {
      await withLong.close();
      await without.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
