import ort from 'onnxruntime-node';
import fs from 'node:fs';
import { KvSlots, slotStepDone, slotStepFeeds } from '../dist/src/inference/runtime/kv-slots.js';
const [file, threadsS = '2'] = process.argv.slice(2);
const s = await ort.InferenceSession.create(fs.readFileSync(file), { graphOptimizationLevel: 'all', intraOpNumThreads: Number(threadsS), interOpNumThreads: 1 });
const meta = s.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name));
const mk = () => new KvSlots({ layers: meta.length, kvHeads: Number(meta[0].shape[1]), headDim: Number(meta[0].shape[3]), positionsMax: 2048, emptyCacheFeeds: true });
async function fill(sl, seqs, len) { for (let done = 0; done < len; ) { const n = Math.min(128, len - done); const st = slotStepFeeds(sl, seqs.map((seq) => ({ seq, tokens: Array.from({ length: n }, (_, j) => 5 + j) }))); slotStepDone(sl, st, await s.run(st.feeds)); done += n; } }
const med = (v) => [...v].sort((x, y) => x - y)[v.length >> 1];
// time steps without growing: step then delete the new position? simpler: time single steps on fresh copies each rep
async function timeStep(build, rowsOf) { const sl = await build(); const rows = rowsOf(); const ts = []; for (let r = 0; r < 14; r++) { const st = slotStepFeeds(sl, rows.map((seq) => ({ seq, tokens: [7] }))); const t = performance.now(); const out = await s.run(st.feeds); ts.push(performance.now() - t); slotStepDone(sl, st, out); } return med(ts.slice(4)).toFixed(2) + ' (cap ' + sl.cap + ')'; }
const shorts = Array.from({ length: 15 }, (_, i) => i);
for (const L of [90, 300, 900]) {
  const both = await timeStep(async () => { const sl = mk(); await fill(sl, shorts, 90); await fill(sl, [99], L); return sl; }, () => [...shorts, 99]);
  const cap = (() => 0)();
  const lone = await timeStep(async () => { const sl = mk(); await fill(sl, [99], L); return sl; }, () => [99]);
  console.log(`L=${L}: 16 rows together ${both} ms; the long row alone ${lone} ms`);
}
const shortOnly = await timeStep(async () => { const sl = mk(); await fill(sl, shorts, 90); return sl; }, () => shorts);
console.log(`15 short rows alone ${shortOnly} ms`);
