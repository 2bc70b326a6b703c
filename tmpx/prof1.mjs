import ort from 'onnxruntime-node';
import fs from 'node:fs';
import { KvSlots, slotStepDone, slotStepFeeds } from '../dist/src/inference/runtime/kv-slots.js';
import { spinningSessionConfig } from '../dist/src/inference/runtime/spin.js';
const [file, threadsS, B = '1'] = process.argv.slice(2);
const threads = Number(threadsS);
const opts = { graphOptimizationLevel: 'all', intraOpNumThreads: threads, interOpNumThreads: 1, enableProfiling: true, profileFilePrefix: '/tmp/ortprof', extra: { session: threads > 1 ? spinningSessionConfig() : {} } };
const s = await ort.InferenceSession.create(file, opts);
const meta = s.inputMetadata.filter((m) => /^cache\.\d+\.key$/.test(m.name));
const rows = Number(B);
for (let pass = 0; pass < 6; pass++) {
  const sl = new KvSlots({ layers: meta.length, kvHeads: Number(meta[0].shape[1]), headDim: Number(meta[0].shape[3]), positionsMax: 1024, emptyCacheFeeds: true });
  const seqs = Array.from({ length: rows }, (_, i) => i);
  const run = async (n) => { const st = slotStepFeeds(sl, seqs.map((seq) => ({ seq, tokens: Array.from({ length: n }, (_, j) => 5 + j) }))); slotStepDone(sl, st, await s.run(st.feeds)); };
  await run(20);
  for (let i = 0; i < 64; i++) await run(1);
}
s.endProfiling(); const f = fs.readdirSync('/tmp').filter((x) => x.startsWith('ortprof')).map((x) => '/tmp/' + x).sort().pop();
const ev = JSON.parse(fs.readFileSync(f));
const by = new Map(); let runs = 0, runTotal = 0;
const nodeEv = ev.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time'));
const modelRuns = ev.filter((e) => e.cat === 'Session' && e.name === 'model_run');
// decode runs only: those shorter than the median*3
const durs = modelRuns.map((e) => e.dur).sort((a, b) => a - b);
const med = durs[durs.length >> 1];
console.log('model_run count', durs.length, 'median us', med);
// attribute kernel events to runs by timestamp
const decodeRuns = modelRuns.filter((e) => e.dur < med * 2).slice(64);
let kt = 0;
for (const r of decodeRuns) for (const e of nodeEv) if (e.ts >= r.ts && e.ts <= r.ts + r.dur) { const k = e.args.op_name; const v = by.get(k) ?? { n: 0, us: 0 }; v.n++; v.us += e.dur; by.set(k, v); kt += e.dur; }
const n = decodeRuns.length;
console.log('decode runs', n, 'mean run us', (decodeRuns.reduce((a, e) => a + e.dur, 0) / n).toFixed(1), 'kernel sum per run us', (kt / n).toFixed(1));
for (const [k, v] of [...by].sort((a, b) => b[1].us - a[1].us)) console.log(k.padEnd(28), (v.n / n).toFixed(0).padStart(4), 'nodes', (v.us / n).toFixed(1).padStart(8), 'us/run');
fs.unlinkSync(f);
