// The charge journal's cost per settled request (issue 12.3): appends of real-sized entries,
// with the background fdatasync every JOURNAL_FSYNC_INTERVAL_MS, timed in one run.
// Usage: node dist/bench/journal.js [--entries 200000]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { JOURNAL_FSYNC_INTERVAL_MS } from '../src/inference/policy/charge-journal.js';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const N = arg('entries', 200_000);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'journal-bench-'));
const fd = fs.openSync(path.join(dir, 'j.journal'), 'a');
const entry = { w: '01JD3Q8W5Z9YQ0M4R6T2V8X1CE', m: 'cloudgate/stories260k', n: 14_800_000, r: null, i: 20, o: 64 };
let syncs = 0;
let syncNs = 0n;
let dirty = false;
// As the journal does: fdatasync on libuv's thread pool, so the event loop never waits for the disk.
let syncing = false;
const timer = setInterval(() => {
  if (!dirty || syncing) return;
  const t = process.hrtime.bigint();
  dirty = false;
  syncing = true;
  fs.fdatasync(fd, () => {
    syncNs += process.hrtime.bigint() - t;
    syncs++;
    syncing = false;
  });
}, JOURNAL_FSYNC_INTERVAL_MS);
const times: number[] = [];
let s = 0;
const t0 = process.hrtime.bigint();
for (let i = 0; i < N; i++) {
  const t = process.hrtime.bigint();
  fs.writeSync(fd, `${JSON.stringify({ s: ++s, ...entry })}\n`);
  dirty = true;
  times.push(Number(process.hrtime.bigint() - t) / 1000);
  // Let the fsync timer run now and then, as it does between requests.
  if (i % 5000 === 0) await new Promise((r) => setImmediate(r));
}
const totalMs = Number(process.hrtime.bigint() - t0) / 1e6;
await new Promise((r) => setTimeout(r, JOURNAL_FSYNC_INTERVAL_MS + 50));
clearInterval(timer);
times.sort((a, b) => a - b);
const q = (p: number) => times[Math.floor(p * (times.length - 1))]!.toFixed(1);
const bytes = fs.fstatSync(fd).size;
console.log(`journal appends: ${N} entries, ${(bytes / N).toFixed(0)} bytes each, ${((totalMs * 1000) / N).toFixed(2)} us per append on average`);
console.log(`append latency p50 ${q(0.5)} us, p99 ${q(0.99)} us, max ${q(1)} us`);
console.log(`fdatasync: ${syncs} calls, ${syncs ? (Number(syncNs) / 1e3 / syncs).toFixed(0) : 0} us each, off the event loop (every ${JOURNAL_FSYNC_INTERVAL_MS} ms while dirty)`);
fs.closeSync(fd);
fs.rmSync(dir, { recursive: true, force: true });
