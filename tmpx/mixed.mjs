import ort from 'onnxruntime-node';
import fs from 'node:fs';
import { KvSlots, slotStepDone, slotStepFeeds } from '../dist/src/inference/runtime/kv-slots.js';
import { prefillGraph } from '../dist/src/inference/runtime/prefill-graph.js';
import { weightTypeHere } from '../dist/src/inference/runtime/integer-products.js';
const [file, shortS = '90', longS = '900', nShortS = '15', threadsS = '2', int8 = '0'] = process.argv.slice(2);
const [SHORT, LONG, NS, T] = [Number(shortS), Number(longS), Number(nShortS), Number(threadsS)];
const graph = int8 === '1' ? prefillGraph(fs.readFileSync(file), await weightTypeHere()) : fs.readFileSync(file);
const s = await ort.InferenceSession.create(graph, { graphOptimizationLevel: 'all', intraOpNumThreads: T, interOpNumThreads: 1 });
const meta = s.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name));
const mk = () => new KvSlots({ layers: meta.length, kvHeads: Number(meta[0].shape[1]), headDim: Number(meta[0].shape[3]), positionsMax: 2048, emptyCacheFeeds: true });
async function fill(sl, seqs, len) { // prompt in chunks of 128
  for (let done = 0; done < len; ) { const n = Math.min(128, len - done); const st = slotStepFeeds(sl, seqs.map((seq) => ({ seq, tokens: Array.from({ length: n }, (_, j) => 5 + j) }))); slotStepDone(sl, st, await s.run(st.feeds)); done += n; }
}
const step = async (sl, seqs) => { const st = slotStepFeeds(sl, seqs.map((seq) => ({ seq, tokens: [7] }))); slotStepDone(sl, st, await s.run(st.feeds)); };
const shorts = Array.from({ length: NS }, (_, i) => i);
// one pool: shorts and the long row together
const one = mk(); await fill(one, shorts, SHORT); await fill(one, [99], LONG);
// two pools
const a = mk(), b = mk(); await fill(a, shorts, SHORT); await fill(b, [99], LONG);
const res = { one: [], two: [] };
for (let r = 0; r < 8; r++) for (const k of r % 2 ? ['one', 'two'] : ['two', 'one']) {
  const t = performance.now();
  for (let i = 0; i < 8; i++) { if (k === 'one') await step(one, [...shorts, 99]); else { await step(a, shorts); await step(b, [99]); } }
  res[k].push((performance.now() - t) / 8);
}
const med = (v) => [...v].sort((x, y) => x - y)[v.length >> 1];
console.log(`rows ${NS} x ${SHORT} + 1 x ${LONG}, threads ${T}, int8 products ${int8}: caps one ${one.cap}, two ${a.cap} + ${b.cap}; step ms one ${med(res.one).toFixed(2)}, two ${med(res.two).toFixed(2)}`);
