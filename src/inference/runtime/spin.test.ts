import ort from 'onnxruntime-node';
import { describe, expect, it } from 'vitest';
import { GraphBuilder } from '../convert/onnx-graph.js';
import { DECODE_SPIN_AFTER_STEP_US, spinningSessionConfig } from './spin.js';

// The spinning sessions' threads: a decode session's go on spinning a bounded time after each
// step (so the next step of a decode run finds them awake), and an idle model's then sleep.

/** A product onnxruntime splits over its threads: [64, 512] x [512, 512] in float32. */
function product(): Uint8Array {
  const gb = new GraphBuilder();
  const w = new Float32Array(512 * 512).map((_, i) => Math.sin(i) / 64);
  gb.op1('MatMul', [gb.input('x', 'float32', [64, 512]), gb.init('w', [512, 512], w)], {}, 'y');
  gb.output('y', 'float32', [64, 512]);
  return gb.encode({ graphName: 'spin', opset: 17, producer: 'test' }).model;
}

/** CPU time (ms) the process spends in `ms` of wall time with nothing to run. */
async function idleCpuMs(ms: number): Promise<number> {
  const before = process.cpuUsage();
  await new Promise((r) => setTimeout(r, ms));
  const used = process.cpuUsage(before);
  return (used.user + used.system) / 1000;
}

describe('spinningSessionConfig', () => {
  it('bounds how long a decode session spins after a step; a prompt session stops at once', () => {
    expect(spinningSessionConfig('decode')).toMatchObject({ intra_op: { allow_spinning: '1', spin_duration_us: String(DECODE_SPIN_AFTER_STEP_US) } });
    expect(spinningSessionConfig('decode')).not.toHaveProperty('force_spinning_stop');
    expect(spinningSessionConfig('prompt')).toMatchObject({ intra_op: { allow_spinning: '1' }, force_spinning_stop: '1' });
  });

  it("lets an idle decode session's threads sleep: no core held a moment after its last step", async () => {
    const s = await ort.InferenceSession.create(product(), { intraOpNumThreads: 2, interOpNumThreads: 1, extra: { session: spinningSessionConfig('decode') } });
    try {
      const x = new ort.Tensor('float32', new Float32Array(64 * 512).fill(0.5), [64, 512]);
      for (let i = 0; i < 20; i++) await s.run({ x });
      // onnxruntime's own unbounded default spins ~45 ms after a run (measured on an Intel
      // machine: 46-48 ms of CPU in the 500 ms after it); this session's bound is 1 ms, and the
      // rest is the idle process's own timers. Measured: 7.0-8.7 ms.
      expect(await idleCpuMs(500)).toBeLessThan(30);
    } finally {
      await s.release();
    }
  });
});
