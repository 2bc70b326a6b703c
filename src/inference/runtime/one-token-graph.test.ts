import { describe, expect, it } from 'vitest';
import onnxProto from 'onnx-proto';
import { generateCheckpoint } from '../convert/generate.js';
import { buildLlamaOnnx } from '../convert/onnx-writer.js';
import { checkedSlotSteps, promptsBesideDecoding } from '../../../test/reference-steps.js';
import { oneTokenGraph } from './one-token-graph.js';

// The one-token graph (a slot-cache graph rewritten for steps of one token a row) driven as the
// worker drives its spinning session: prompts on the slot graph, every decode step on the
// rewritten one, each step checked against run.c's forward pass; with rows of different lengths in
// one step, grouped query heads, a cache grown past its first capacity, and the graphs it leaves alone.

const TOL = 1e-4;
const shape = (heads: number, kvHeads: number) => ({ dim: 32, hiddenDim: 48, nLayers: 2, nHeads: heads, nKvHeads: kvHeads, vocabSize: 64, seqLen: 160, seed: 5, std: 0.3 });
const opTypes = (bytes: Uint8Array) => onnxProto.onnx.ModelProto.decode(bytes).graph!.node!.map((n) => n.opType!);
const count = (types: string[], op: string) => types.filter((t) => t === op).length;

describe('oneTokenGraph', () => {
  for (const [heads, kvHeads] of [
    [4, 4],
    [8, 4],
    [4, 1],
  ] as const) {
    it(`answers decode steps as run.c does (${heads} heads, ${kvHeads} kv heads)`, async () => {
      const ck = generateCheckpoint(shape(heads, kvHeads));
      const slot = buildLlamaOnnx(ck, { kvLayout: 'slots' }).model;
      const one = oneTokenGraph(slot)!;
      expect(one).toBeDefined();
      const { step, maxErr, tok, oneTokenSteps } = await checkedSlotSteps(ck, slot, one);
      await promptsBesideDecoding(step, tok);
      // Rows of 40, 3 and ~20 positions stepping together, then one row alone for long enough to grow its cache.
      await step([
        { seq: 5, tokens: tok(37, 5) },
        { seq: 6, tokens: tok(2, 9) },
      ]);
      for (let i = 0; i < 4; i++) await step([5, 6, 1].map((seq) => ({ seq, tokens: tok(1, seq + i) })));
      for (let i = 0; i < 70; i++) await step([{ seq: 6, tokens: tok(1, i) }]);
      expect(oneTokenSteps()).toBeGreaterThan(70);
      expect(maxErr()).toBeLessThan(TOL);
    });
  }

  it('has no MatMul for the own key and value, no softmax floor, and no Transpose of the heads', () => {
    const slot = buildLlamaOnnx(generateCheckpoint(shape(8, 4)), { kvLayout: 'slots' }).model;
    const [before, after] = [opTypes(slot), opTypes(oneTokenGraph(slot)!)];
    const layers = 2;
    // Each layer: four MatMuls (the cache's keys and values, the own ones) become two.
    expect(count(before, 'MatMul') - count(after, 'MatMul')).toBe(2 * layers);
    // The floor's ReduceMax, Sub and Max are gone; the Transposes left are the cache keys' (one a layer, folded into its MatMul by onnxruntime).
    expect(count(after, 'ReduceMax')).toBe(0);
    expect(count(after, 'Max')).toBe(0);
    expect(count(after, 'Transpose')).toBe(layers);
    // Six nodes a layer fewer (four in the core, the two Transposes of heads), and the Tile of the new tokens' bias for grouped heads.
    expect(before.length - after.length).toBe(6 * layers + 1);
    // Nothing left that no node reads.
    const g = onnxProto.onnx.ModelProto.decode(oneTokenGraph(slot)!).graph!;
    const read = new Set([...g.node!.flatMap((n) => n.input ?? []), ...g.output!.map((o) => o.name!)]);
    expect(g.node!.flatMap((n) => n.output ?? []).filter((o) => o && !read.has(o))).toEqual([]);
    expect(g.initializer!.map((t) => t.name!).filter((name) => !read.has(name))).toEqual([]);
    // The same inputs, so the worker feeds it as it feeds the slot graph.
    const inputs = (b: Uint8Array) => onnxProto.onnx.ModelProto.decode(b).graph!.input!.map((i) => i.name);
    expect(inputs(oneTokenGraph(slot)!)).toEqual(inputs(slot));
  });

  it('rewrites a graph of 4-bit weights too', () => {
    const slot = buildLlamaOnnx(generateCheckpoint(shape(4, 4)), { kvLayout: 'slots', weights: 'int4' }).model;
    const one = oneTokenGraph(slot)!;
    expect(count(opTypes(one), 'MatMulNBits')).toBe(count(opTypes(slot), 'MatMulNBits'));
    expect(count(opTypes(one), 'ReduceSum')).toBe(2);
  });

  it('leaves alone the graphs whose attention is not the slot form: the past layout', () => {
    expect(oneTokenGraph(buildLlamaOnnx(generateCheckpoint(shape(4, 4)), { kvLayout: 'past' }).model)).toBeUndefined();
  });
});
