import { describe, expect, it } from 'vitest';
import onnxProto from 'onnx-proto';
import { generateCheckpoint } from '../convert/generate.js';
import { buildLlamaOnnx } from '../convert/onnx-writer.js';
import { headSize } from '../convert/llama2c.js';
import { residentGraph } from './resident-graph.js';
import { DEVICE_PASSES, dropSoftmaxFloor, singleProgramProducts } from './device-passes.js';

// The device passes' shape: what each takes out of a slot graph (the device-resident cache's
// tests, kv-resident.test.ts, run the passed graph against run.c's forward pass on the CPU and on
// webgpu; webgpu.test.ts serves chat through it).

const { onnx } = onnxProto;
const LAYERS = 3;
const ck = generateCheckpoint({ dim: 32, hiddenDim: 64, nLayers: LAYERS, nHeads: 8, nKvHeads: 4, vocabSize: 64, seqLen: 64, seed: 2, std: 0.3 });
const layout = { layers: LAYERS, kvHeads: 4, headDim: headSize(ck.config) };
const slotGraph = buildLlamaOnnx(ck, { kvLayout: 'slots', weights: 'int4' }).model;

const graphOf = (bytes: Uint8Array) => onnx.ModelProto.decode(bytes).graph!;
const count = (g: onnxProto.onnx.IGraphProto, op: string) => g.node!.filter((n) => n.opType === op).length;

describe('device passes', () => {
  it('take the softmax floor and the two-program products out of every layer', () => {
    const before = graphOf(residentGraph(slotGraph, layout, [])!);
    const after = graphOf(residentGraph(slotGraph, layout)!);
    expect(count(before, 'ReduceMax')).toBe(LAYERS);
    expect(count(after, 'ReduceMax') + count(after, 'Max') + count(after, 'Sub')).toBe(0);
    expect(count(after, 'Softmax')).toBe(LAYERS);
    expect(after.node!.length).toBe(before.node!.length - 3 * LAYERS);
    const levels = (g: onnxProto.onnx.IGraphProto) => g.node!.filter((n) => n.opType === 'MatMulNBits').map((n) => Number(n.attribute!.find((a) => a.name === 'accuracy_level')!.i));
    expect(new Set(levels(before))).toEqual(new Set([4]));
    expect(new Set(levels(after))).toEqual(new Set([0]));
    // The floor's constant left with it: nothing unread stays behind.
    const read = new Set(after.node!.flatMap((n) => n.input!));
    expect(after.initializer!.filter((t) => !read.has(t.name!)).map((t) => t.name)).toEqual([]);
  });

  it('leave a graph without their patterns as it is, and count what they changed', () => {
    const g = graphOf(residentGraph(slotGraph, layout)!);
    const nodes = g.node!.length;
    for (const pass of DEVICE_PASSES) expect(pass.apply(g), pass.name).toBe(0);
    expect(g.node!.length).toBe(nodes);
    const fresh = graphOf(residentGraph(slotGraph, layout, [])!);
    expect(dropSoftmaxFloor.apply(fresh)).toBe(3 * LAYERS);
    expect(singleProgramProducts.apply(fresh)).toBe(count(fresh, 'MatMulNBits'));
  });
});
