import { KvSlots } from '../dist/src/inference/runtime/kv-slots.js';
const sl = new KvSlots({ layers: 12, kvHeads: 12, headDim: 64, positionsMax: 1024, emptyCacheFeeds: true });
for (let r = 0; r < 8; r++) {
  sl.open(1); sl.reserve(760);
  // fake fill: write lens via write()
  const S = 750, H = 12, D = 64; const nk = Array.from({ length: 12 }, () => new Float32Array(H * S * D).fill(0.5));
  sl.write(0, [S], S, nk, nk);
  let t = performance.now(); const k = sl.takeOut(1); const take = performance.now() - t;
  t = performance.now(); sl.putIn(2, k, 740); const put = performance.now() - t;
  sl.delete(2);
  console.log(`takeOut ${take.toFixed(2)} ms putIn ${put.toFixed(2)} ms (${(k.k.reduce((n, b) => n + b.byteLength, 0) * 2 / 1e6).toFixed(1)} MB)`);
}
