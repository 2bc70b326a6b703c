import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ensureDefaultModels } from '../convert/default-models.js';
import { Engine } from './engine.js';

// MODEL_THREADS_NICE / MODEL_THREADS_SCHED: each model's worker thread and the ONNX threads
// it starts run at the given niceness and policy; the process's other threads (the HTTP thread
// first) stay as they were.

/** A field of each thread's /proc/<pid>/task/<tid>/stat: 19 niceness, 41 scheduling policy (5: SCHED_IDLE). */
function statByThread(field: number): Map<number, number> {
  const out = new Map<number, number>();
  for (const t of fs.readdirSync('/proc/self/task')) {
    const st = fs.readFileSync(`/proc/self/task/${t}/stat`, 'utf8');
    out.set(Number(t), Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[field - 3]));
  }
  return out;
}
const niceByThread = () => statByThread(19);
const policyByThread = () => statByThread(41);
const SCHED_IDLE = 5;

describe.skipIf(process.platform !== 'linux')('model threads niceness (Linux)', () => {
  const modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-nice-'));
  let engine: Engine | undefined;
  afterAll(async () => {
    await engine?.close();
    fs.rmSync(modelsDir, { recursive: true, force: true });
  });

  it('lowers the model threads, not the main thread', async () => {
    ensureDefaultModels({ modelsDir });
    const before = niceByThread();
    engine = await Engine.load({ modelsDir, executionProvider: 'cpu', strict: false, intraOpThreads: 2, threadsNice: 7 });
    const models = engine.list().length;
    const after = niceByThread();
    const lowered = [...after].filter(([tid, n]) => !before.has(tid) && n === 7);
    // A worker thread and at least one pool thread (2 intra-op threads: the caller and one more) per model.
    expect(lowered.length).toBeGreaterThanOrEqual(2 * models);
    expect(after.get(process.pid)).toBe(before.get(process.pid));
    expect([...after].filter(([tid]) => before.has(tid)).every(([tid, n]) => n === before.get(tid))).toBe(true);
  });

  it('puts the model threads, not the others, under SCHED_IDLE when asked', async () => {
    const before = policyByThread();
    const idle = await Engine.load({ modelsDir, executionProvider: 'cpu', strict: false, intraOpThreads: 2, threadsSched: 'idle' });
    try {
      const after = policyByThread();
      const models = idle.list().length;
      expect([...after].filter(([tid, p]) => !before.has(tid) && p === SCHED_IDLE).length).toBeGreaterThanOrEqual(2 * models);
      expect([...after].filter(([tid]) => before.has(tid)).every(([tid, p]) => p === before.get(tid))).toBe(true);
      expect(after.get(process.pid)).toBe(0);
    } finally {
      await idle.close();
    }
  });
});
