import { startDaemon, stopDaemon } from '../dist/test/daemon.js';
import { benchKey, chatStream } from '../dist/bench/lib.js';
const d = await startDaemon({ RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0', MODELS_DIR: '/tmp/k14/m25-int4', KV_SPLIT_LONG_ROWS: process.argv[2] ?? 'true' });
const key = await benchKey(d, ['inference:use'], 1e9);
const url = `${d.inferenceUrl}/v1/chat/completions`;
const story = 'Once upon a time there was a little girl named Lily who loved to play in the park with her friends and her dog'.split(' ');
const long = Array.from({ length: 500 }, (_, i) => story[i % story.length]).join(' ');
const o = { model: 'peer/m25', maxTokens: 64, firstToken: true };
const t0 = performance.now();
const counts = new Array(16).fill(0); const reqs = new Array(16).fill(0); const ends = new Array(16).fill(0);
await Promise.all(Array.from({ length: 16 }, async (_, i) => {
  while (performance.now() - t0 < 4000) {
    const r = i === 15 ? await chatStream(url, key, long, { ...o, maxTokens: 256 }) : await chatStream(url, key, `Once upon a time ${i}`, o);
    counts[i] += r.tokens; reqs[i]++; ends[i] = performance.now() - t0;
  }
}));
console.log('elapsed', ((performance.now() - t0) / 1000).toFixed(2), 's; tokens', counts.reduce((a, b) => a + b), 'by stream', counts.join(' '), '; requests', reqs.join(' '), '; ends', ends.map((e) => (e / 1000).toFixed(1)).join(' '));
await stopDaemon(d);
