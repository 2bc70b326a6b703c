import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ensureDefaultModels } from '../convert/default-models.js';
import { Engine } from './engine.js';

// MODEL_THREADS_NICE: each model's worker thread and the ONNX threads it starts run at
// the given niceness; the process's other threads (the HTTP thread first) stay as they were.

/** Niceness of each thread of this process (field 19 of /proc/<pid>/task/<tid>/stat). */
function niceByThread(): Map<number, number> {
  const out = new Map<number, number>();
  for (const t of fs.readdirSync('/proc/self/task')) {
    const st = fs.readFileSync(`/proc/self/task/${t}/stat`, 'utf8');
    out.set(Number(t), Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[16]));
  }
  return out;
}

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
});
