import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import ort from 'onnxruntime-node';
import { generateCheckpoint } from '../convert/generate.js';
import { buildLlamaOnnx, OPSET } from '../convert/onnx-writer.js';
import { RefSequences } from '../convert/reference.js';
import { headSize } from '../convert/llama2c.js';
import { ResidentSlots } from './kv-resident.js';
import { growGraph, residentGraph } from './resident-graph.js';
import { rewrittenGraphSessionConfig } from './external-data.js';
import { webgpuMissing } from '../../../test/webgpu-probe.js';
import { promptsBesideDecoding, referenceSteps } from '../../../test/reference-steps.js';

// The device-resident cache (resident-graph.ts, kv-resident.ts) driven as the worker drives it,
// checked against run.c's forward pass one sequence at a time: rows of different lengths in one
// step (left pads written past the rows' lengths), chunked prompts, a sequence leaving and its
// slot taken by the next, more sequences than the slots (the grow graph adds slots) and a prompt
// past the capacity (it adds positions). On the CPU provider the tensor comes back to the host
// each step; on webgpu (where an adapter opens: Mesa's lavapipe on a machine without a GPU) it
// stays on the device. With `external`, the graph keeps its weights in a file beside it (ONNX
// external data) and loads from the rewritten bytes as the worker loads it.

const TOL = 1e-4;

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** The slot graph of `ck`, rewritten, and the session config it loads with: its weights written to a folder beside it where `external`. */
function residentStep(ck: ReturnType<typeof generateCheckpoint>, layout: Parameters<typeof residentGraph>[1], external: boolean): { step: Uint8Array; session: Record<string, string> } {
  if (!external) return { step: residentGraph(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model, layout)!, session: {} };
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cg-resident-'));
  dirs.push(dir);
  const built = buildLlamaOnnx(ck, { kvLayout: 'slots', externalDataFile: 'model.onnx.data' });
  expect(built.data!.byteLength).toBeGreaterThan(built.model.byteLength);
  const file = path.join(dir, 'model.onnx');
  fs.writeFileSync(file, built.model);
  fs.writeFileSync(path.join(dir, 'model.onnx.data'), built.data!);
  return { step: residentGraph(fs.readFileSync(file), layout)!, session: rewrittenGraphSessionConfig(file) };
}

describe('device-resident KV cache', () => {
  // 9 layers: 18 keys and values, more than one Split may give out on webgpu (resident-graph.ts SPLIT_OUTPUTS_MAX).
  for (const [provider, layers, external] of [
    ['cpu', 2, false],
    ['cpu', 9, false],
    ['cpu', 2, true],
    ['webgpu', 2, false],
    ['webgpu', 9, false],
    ['webgpu', 2, true],
  ] as const) {
    it(`matches the reference through joins, leaves, slot reuse and growth (${provider}, ${layers} layers${external ? ', weights in a file beside the graph' : ''})`, async (ctx) => {
      const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: layers, nHeads: 8, nKvHeads: 4, vocabSize: 64, seqLen: 200, seed: 5, std: 0.3 });
      const layout = { layers, kvHeads: 4, headDim: headSize(ck.config), positionsMax: 200 };
      const { step, session } = residentStep(ck, layout, external);
      expect(step).toBeDefined();
      if (provider === 'webgpu') {
        const missing = await webgpuMissing(step, session);
        if (missing) {
          console.warn(`webgpu resident-cache test skipped: no WebGPU adapter here (${missing})`);
          ctx.skip();
        }
      }
      const onDevice = provider === 'webgpu' ? { preferredOutputLocation: { logits: 'cpu', kv_cache_out: 'gpu-buffer' } as const } : {};
      const opts = { intraOpNumThreads: 1, executionProviders: [provider], ...onDevice };
      const sessions = {
        step: await ort.InferenceSession.create(step, { ...opts, extra: { session } }),
        grow: await ort.InferenceSession.create(growGraph(layout, OPSET), { ...opts, preferredOutputLocation: provider === 'webgpu' ? { kv_cache_out: 'gpu-buffer' } : undefined }),
      };
      const kv = new ResidentSlots(layout, sessions);
      const { check, maxErr, tok } = referenceSteps(ck);
      const run = async (rows: Array<{ seq: number; tokens: number[] }>) => check(rows, await kv.step(rows, (feeds) => sessions.step.run(feeds)), (seq) => kv.len(seq));
      // Prompts beside decoding rows, one in two chunks.
      await promptsBesideDecoding(run, tok);
      // Sequence 2 leaves; sequence 5 takes its slot (its stale positions hidden), rows in any order.
      expect(kv.delete(2)).toBe(true);
      expect(kv.has(2)).toBe(false);
      const bytes = kv.bytes;
      await run([
        { seq: 4, tokens: tok(1, 4) },
        { seq: 5, tokens: tok(3, 6) },
        { seq: 1, tokens: tok(1, 1) },
      ]);
      expect(kv.bytes).toBe(bytes);
      // More sequences than the 4 slots: the grow graph doubles them, keeping every row's positions.
      await run([6, 7, 3].map((seq) => ({ seq, tokens: tok(seq === 3 ? 1 : 4, seq) })));
      expect(kv.bytes).toBe(2 * bytes);
      expect(kv.onDevice).toBe(provider === 'webgpu');
      for (let i = 0; i < 2; i++) await run([1, 3, 4, 5, 6, 7].map((seq) => ({ seq, tokens: tok(1, seq * 3 + i) })));
      // A prompt past the capacity: the grow graph adds positions, still keeping every row's.
      const cap = kv.cap;
      await run([{ seq: 8, tokens: tok(cap + 5, 8) }]);
      expect(kv.cap).toBeGreaterThan(cap);
      await run([1, 8, 6].map((seq) => ({ seq, tokens: tok(1, seq + 5) })));
      expect(maxErr()).toBeLessThan(TOL);
      await expect(kv.step([{ seq: 1, tokens: tok(200, 1) }], (feeds) => sessions.step.run(feeds))).rejects.toThrow(/passes the model's 200/);
      expect(kv.release()).toBe(false);
      for (const seq of [1, 3, 4, 5, 6, 7, 8]) kv.delete(seq);
      expect(kv.release()).toBe(true);
      expect(kv.bytes).toBe(0);
      // A fresh tensor after the release.
      await run([{ seq: 9, tokens: tok(3, 9) }]);
    });
  }

  it('refuses a step that would grow the device tensor past its bound, before running it, and goes on for the others', async () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 200, seed: 3, std: 0.3 });
    const layout = { layers: 2, kvHeads: 2, headDim: headSize(ck.config), positionsMax: 200 };
    const sessions = {
      step: await ort.InferenceSession.create(residentGraph(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model, layout)!, { intraOpNumThreads: 1 }),
      grow: await ort.InferenceSession.create(growGraph(layout, OPSET), { intraOpNumThreads: 1 }),
    };
    // 4 slots of 64 positions fit; 4 slots of 80 do not.
    const fresh = 2 * 2 * 4 * 2 * 64 * headSize(ck.config) * 4;
    const kv = new ResidentSlots(layout, sessions, fresh);
    let runs = 0;
    const run = (feeds: Record<string, ort.Tensor>) => (runs++, sessions.step.run(feeds));
    await kv.step([{ seq: 1, tokens: [1, 2, 3] }], run);
    await expect(kv.step([{ seq: 2, tokens: Array.from({ length: 70 }, (_, i) => 1 + (i % 60)) }], run)).rejects.toThrow(/over the \d+ one device buffer may hold/);
    expect(runs).toBe(1);
    kv.delete(2);
    // Where doubling the slots would pass the bound, the slots in use fit exactly: 5 of 64 positions.
    const five = new ResidentSlots(layout, sessions, (fresh * 5) / 4);
    for (let seq = 1; seq <= 5; seq++) await five.step([{ seq, tokens: [seq, seq + 1] }], run);
    expect(five.bytes).toBe((fresh * 5) / 4);
    const refs = new RefSequences(ck);
    refs.feed(1, [1, 2, 3]);
    const logits = await kv.step([{ seq: 1, tokens: [4] }], run);
    const want = refs.feed(1, [4]);
    expect(Math.max(...Array.from(logits, (x, i) => Math.abs(x - want[i]!)))).toBeLessThan(TOL);
  });

  it('leaves a graph without one new_key_values output alone', () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 64, seed: 3, std: 0.3 });
    const layout = { layers: 2, kvHeads: 2, headDim: headSize(ck.config) };
    expect(residentGraph(buildLlamaOnnx(ck, { kvLayout: 'past' }).model, layout)).toBeUndefined();
    expect(residentGraph(buildLlamaOnnx(ck, { kvLayout: 'slots' }).model, layout)).toBeDefined();
  });

  it('does not find a graph\'s external weights from its bytes without the model\'s folder', async () => {
    const ck = generateCheckpoint({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 64, seqLen: 64, seed: 3, std: 0.3 });
    const { step } = residentStep(ck, { layers: 2, kvHeads: 2, headDim: headSize(ck.config) }, true);
    await expect(ort.InferenceSession.create(step, { intraOpNumThreads: 1 })).rejects.toThrow(/external data/i);
  });
});
