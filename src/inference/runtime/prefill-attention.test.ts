import { describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { GraphBuilder } from '../convert/onnx-graph.js';
import { slotAttentionCore } from '../convert/onnx-attention.js';
import { linear } from '../convert/onnx-linear.js';
import { mulberry32 } from './sampler.js';
import { prefillGraph } from './prefill-graph.js';
import { weightTypeHere } from './integer-products.js';
import { LONG_CACHE_POSITIONS_MIN } from './prefill-attention.js';

const KV = 2;
const HD = 8;
const MASKED = -1e9;

/**
 * `layers` attention blocks as the slot graph writes them (each layer's context feeds the next
 * one's queries), beside one 4-bit product so that the prefill graph has something to rewrite.
 */
function model(layers: number): Uint8Array {
  const gb = new GraphBuilder();
  const shape = ['B', KV, 'S', HD];
  const [k, v] = [gb.input('k', 'float32', shape), gb.input('v', 'float32', shape)];
  const [cacheK, cacheV] = [gb.input('cacheK', 'float32', ['B', KV, 'C', HD]), gb.input('cacheV', 'float32', ['B', KV, 'C', HD])];
  const c = { cacheBias: gb.input('cacheBias', 'float32', ['B', 1, 1, 'C']), newBias: gb.input('newBias', 'float32', ['B', 1, 'S', 'S']), probSplit: gb.input('probSplit', 'int64', [2]) };
  let q = gb.input('q', 'float32', shape);
  for (let l = 0; l < layers; l++) q = slotAttentionCore(gb, { q, k, v, cacheK, cacheV }, c);
  gb.output(gb.op1('Identity', [q], {}, 'ctx'), 'float32', shape);
  const w = Float32Array.from({ length: 32 * 8 }, (_, i) => Math.sin(i));
  linear(gb, gb.input('x', 'float32', ['m', 32]), 'w', w, 32, 8, { format: 'int4' }, 'y');
  gb.output('y', 'float32', ['m', 8]);
  return gb.encode({ graphName: 't', opset: 17, producer: 'test' }).model;
}

/** A step of `S` new tokens in `B` rows over a cache of `C` positions, the last `hidden` of them not filled. */
function feeds(B: number, S: number, C: number, hidden: number, seed: number): Record<string, ort.Tensor> {
  const r = mulberry32(seed);
  const t = (n: number, dims: number[]) => new ort.Tensor('float32', Float32Array.from({ length: n }, () => 4 * r() - 2), dims);
  const newBias = new Float32Array(B * S * S);
  for (let b = 0; b < B; b++) for (let i = 0; i < S; i++) for (let j = i + 1; j < S; j++) newBias[(b * S + i) * S + j] = MASKED;
  const cacheBias = new Float32Array(B * C);
  for (let b = 0; b < B; b++) cacheBias.fill(MASKED, b * C + C - hidden, (b + 1) * C);
  return {
    q: t(B * KV * S * HD, [B, KV, S, HD]),
    k: t(B * KV * S * HD, [B, KV, S, HD]),
    v: t(B * KV * S * HD, [B, KV, S, HD]),
    cacheK: t(B * KV * C * HD, [B, KV, C, HD]),
    cacheV: t(B * KV * C * HD, [B, KV, C, HD]),
    cacheBias: new ort.Tensor('float32', cacheBias, [B, 1, 1, C]),
    newBias: new ort.Tensor('float32', newBias, [B, 1, S, S]),
    probSplit: new ort.Tensor('int64', BigInt64Array.of(BigInt(C), BigInt(S)), [2]),
    x: new ort.Tensor('float32', new Float32Array(32), [1, 32]),
  };
}

describe('the prefill graph over a long cache (prefill-attention.ts)', () => {
  it('puts each layer\'s attention under one If on the cache\'s length: two softmax pieces over a long cache, the slot graph\'s nodes otherwise', async () => {
    const bytes = prefillGraph(model(2), await weightTypeHere())!;
    const g = onnxProto.onnx.ModelProto.decode(bytes).graph!;
    const ops = (nodes: onnxProto.onnx.INodeProto[]) => nodes.map((n) => n.opType);
    const ifs = g.node!.filter((n) => n.opType === 'If');
    expect(ifs).toHaveLength(2);
    // one condition for both layers, and nothing of the blocks left outside them
    expect(new Set(ifs.map((n) => n.input![0])).size).toBe(1);
    expect(ops(g.node!)).not.toContain('Softmax');
    expect(ops(g.node!)).not.toContain('Concat');
    const branch = (n: onnxProto.onnx.INodeProto, name: string) => n.attribute!.find((a) => a.name === name)!.g!;
    expect(ops(branch(ifs[0]!, 'else_branch').node!)).toEqual(['Concat', 'ReduceMax', 'Sub', 'Max', 'Softmax', 'Split', 'MatMul', 'MatMul', 'Add']);
    expect(ops(branch(ifs[0]!, 'then_branch').node!)).not.toContain('Concat');
    expect(ops(branch(ifs[0]!, 'then_branch').node!)).toContain('Exp');
  });

  it('answers as the slot graph does on either side of LONG_CACHE_POSITIONS_MIN: the same bits below it, float32 rounding over it', async () => {
    const plain = await ort.InferenceSession.create(model(2));
    const rewritten = await ort.InferenceSession.create(prefillGraph(model(2), await weightTypeHere())!);
    const run = async (s: ort.InferenceSession, f: Record<string, ort.Tensor>) => (await s.run(f)).ctx!.data as Float32Array;
    const largestDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0);
    // a first chunk (no cache), a short cache, and a cache at and past the bound with unfilled positions
    for (const [B, S, C, hidden] of [
      [2, 6, 0, 0],
      [2, 6, LONG_CACHE_POSITIONS_MIN - 1, 40],
    ] as const) {
      const f = feeds(B, S, C, hidden, C + 1);
      expect(await run(rewritten, f)).toEqual(await run(plain, f));
    }
    let overBits = 0;
    for (const [B, S, C, hidden] of [
      [2, 6, LONG_CACHE_POSITIONS_MIN, 40],
      [1, 1, LONG_CACHE_POSITIONS_MIN + 60, 0],
      [3, 17, LONG_CACHE_POSITIONS_MIN + 100, 100],
    ] as const) {
      const f = feeds(B, S, C, hidden, C + 2);
      const [want, got] = [await run(plain, f), await run(rewritten, f)];
      expect(largestDiff(got, want)).toBeLessThan(1e-5);
      if (largestDiff(got, want) > 0) overBits++;
    }
    // the two pieces ran: they sum in another order, so some answers differ in their last bits
    expect(overBits).toBeGreaterThan(0);
  });
});
