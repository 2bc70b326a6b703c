import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ensureDefaultModels, findStories260k } from '../convert/default-models.js';
import { Engine } from './engine.js';
import { niceThreadsStartedBy, workerThreadNice } from './thread-policy.js';

// MODEL_THREADS_NICE / MODEL_THREADS_SCHED: each model's ONNX threads run at the given niceness
// and policy, and its worker thread too where the workers' threads could fill the cores
// (thread-policy.ts workerThreadNice); the process's other threads (the HTTP thread first) stay
// as they were.

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
/** Two tests load stories260K, which the default models hold only where ../shared/models has it. */
const stories = findStories260k();
const withStories = `(needs stories260K in ../shared/models${stories ? '' : ': not there, skipped'})`;

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
    const started = [...after].filter(([tid]) => !before.has(tid));
    // Where the workers could fill the cores (4 models on CI's 2) their own threads are lowered too.
    const own = workerThreadNice(7, models, os.availableParallelism()) === 7 ? 7 : os.getPriority();
    // At least one pool thread per model (2 intra-op threads: the caller and one more), and its worker thread.
    expect(started.filter(([, n]) => n === 7).length).toBeGreaterThanOrEqual((own === 7 ? 2 : 1) * models);
    expect(started.filter(([, n]) => n !== 7).length).toBe(own === 7 ? 0 : models);
    expect(after.get(process.pid)).toBe(before.get(process.pid));
    expect([...after].filter(([tid]) => before.has(tid)).every(([tid, n]) => n === before.get(tid))).toBe(true);
  });

  it.skipIf(!stories)(`keeps a lone model's worker thread at the daemon's niceness where it leaves a core, and lowers its pools ${withStories}`, async () => {
    // Written here too (up to date: a hash check), so the test does not lean on the one before it.
    ensureDefaultModels({ modelsDir });
    const oneDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-nice-one-'));
    fs.cpSync(path.join(modelsDir, 'stories260k'), path.join(oneDir, 'stories260k'), { recursive: true });
    const before = niceByThread();
    const one = await Engine.load({ modelsDir: oneDir, executionProvider: 'cpu', strict: false, intraOpThreads: 2, threadsNice: 7 });
    try {
      const started = [...niceByThread()].filter(([tid]) => !before.has(tid)).map(([, n]) => n);
      const own = workerThreadNice(7, 1, os.availableParallelism());
      // The wide and spinning sessions' pools (one thread each), and onnxruntime's environment.
      expect(started.filter((n) => n === 7).length).toBeGreaterThanOrEqual(2);
      // The worker's own thread: at this process's niceness on a machine of 2 cores or more, the only one.
      expect(started.filter((n) => n !== 7)).toEqual(own === 7 ? [] : [os.getPriority()]);
    } finally {
      await one.close();
      fs.rmSync(oneDir, { recursive: true, force: true });
    }
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

describe('the worker thread rule and the pool renicing', () => {
  it("leaves a worker's thread at the daemon's niceness only while the workers are fewer than the cores", () => {
    expect(workerThreadNice(10, 1, 2)).toBe(0);
    expect(workerThreadNice(10, 2, 2)).toBe(10);
    expect(workerThreadNice(10, 4, 2)).toBe(10);
    expect(workerThreadNice(10, 3, 16)).toBe(0);
    expect(workerThreadNice(10, 1, 1)).toBe(10);
  });

  it.skipIf(process.platform !== 'linux' || !stories)(`renices the threads a session starts, and none when they are not as many as expected ${withStories}`, async () => {
    const ort = await import('onnxruntime-node');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-nice-pool-'));
    const sessions: Array<{ release(): Promise<void> }> = [];
    try {
      ensureDefaultModels({ modelsDir: dir });
      const file = path.join(dir, 'stories260k', 'model.onnx');
      const create = async () => {
        const s = await ort.InferenceSession.create(file, { intraOpNumThreads: 2 });
        sessions.push(s);
        return s;
      };
      // The first session of the process also starts onnxruntime's environment thread.
      await create();
      const before = niceByThread();
      const wrong = await niceThreadsStartedBy(create, [0, 2], 5);
      expect(wrong.niced).toBe(false);
      const untouched = [...niceByThread()].filter(([tid]) => !before.has(tid));
      const mine = os.getPriority();
      expect(untouched.map(([, n]) => n)).toEqual([mine]);
      const right = await niceThreadsStartedBy(create, [1], mine + 5);
      expect(right.niced).toBe(true);
      expect([...niceByThread()].filter(([tid]) => !before.has(tid)).map(([, n]) => n).sort((a, b) => a - b)).toEqual([mine, mine + 5]);
    } finally {
      for (const s of sessions) await s.release();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
