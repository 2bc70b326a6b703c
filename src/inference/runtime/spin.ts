// How a model session's intra-op threads wait between operators, as onnxruntime's
// session config entries. Only sessions on several threads have threads that wait.

export const THREAD_SPIN_MODES = ['run', 'always', 'off'] as const;
/**
 * - `run`: they spin while a step runs and sleep as soon as it returns (onnxruntime's
 *   force_spinning_stop): no wake-up per operator inside a step, no core held between steps;
 * - `always`: onnxruntime's default, they spin between steps too (holding a core from the
 *   HTTP thread and the other models while the model is idle);
 * - `off`: they sleep whenever they wait, so each operator wakes them again.
 */
export type ThreadSpin = (typeof THREAD_SPIN_MODES)[number];

/** What ORT_INTRA_OP_SPIN takes: a mode, or (as before the modes) true / false for always / off. */
export const THREAD_SPIN_SETTINGS = [...THREAD_SPIN_MODES, 'true', 'false', '1', '0'] as const;
export type ThreadSpinSetting = (typeof THREAD_SPIN_SETTINGS)[number];

export function threadSpinOf(setting: ThreadSpinSetting): ThreadSpin {
  if (setting === 'true' || setting === '1') return 'always';
  if (setting === 'false' || setting === '0') return 'off';
  return setting;
}

/** The session config entries (onnxruntime-node's `extra.session`) of a spin mode. */
export function spinSessionConfig(mode: ThreadSpin): Record<string, unknown> {
  if (mode === 'off') return { intra_op: { allow_spinning: '0' } };
  if (mode === 'always') return { intra_op: { allow_spinning: '1' } };
  return { intra_op: { allow_spinning: '1' }, force_spinning_stop: '1' };
}

/**
 * The spinning session's parallel loops hand out their work in shrinking blocks (onnxruntime's
 * `dynamic_block_base`), so that when the HTTP thread or a client takes the core of one of its
 * two threads mid-loop, the other goes on with the rest instead of waiting for it at the loop's
 * end: one stream through the daemon +4 % for m25 int4 (11 of 16 alternated pairs) and +3.5 % for
 * m110 int4, where the graph alone, with no one else on the cores, ran 2 % slower (m25) to 5 %
 * faster (m110) with it (bench/README.md "Spinning for a few streams").
 */
const SPINNING_DYNAMIC_BLOCK_BASE = 4;

/**
 * How long the decode steps' spinning session's threads go on spinning once a step has returned,
 * before they sleep (onnxruntime's `intra_op.spin_duration_us`; they used to sleep at once,
 * force_spinning_stop). A decode run's next step starts a fraction of a millisecond later, and a
 * sleeping thread on a VM whose idle vCPU halts wakes late, so the step's first products ran on
 * one core. One stream through the daemon against sleeping at once (`ab.js`, alternated pairs, an
 * Intel machine with AMX; the phases' rates swung 1.5-2x): m25 int4 1.081 (geometric mean, 11 of
 * 16 pairs) with a token a chunk (logprobs), 1.062 (8 of 10) and 1.007 (8 of 16) without; m110
 * int4 1.087 (9 of 12) and 0.915 (5 of 12). Against 3,000 us: 1.060 (11 of 16) with logprobs,
 * even without; 3,000 us itself read 0.950-0.975 against sleeping at once with logprobs, whose
 * HTTP thread then wanted the core the spinning thread held. onnxruntime's own default spins ~45
 * ms (it lost in the daemon, 0.961-0.970, on a Zen 4). An idle model's threads sleep after it
 * (bench/README.md "Threads that spin on between decode steps").
 */
export const DECODE_SPIN_AFTER_STEP_US = 1000;

/**
 * The session config entries of a session whose threads spin while a step runs. `decode`: the slot
 * graph's (session-choice.ts `spinning`), where a few streams' decode steps run, and a short prompt
 * where that has been faster; its threads go on spinning DECODE_SPIN_AFTER_STEP_US after each step.
 * `prompt`: the int8-products graph's (`prefillSpinning`, steps of 8-32 tokens), whose threads sleep
 * as soon as its step returns: a prompt is followed by decode steps on the other session, whose
 * threads they would hold a core from (the two measured even, 1.007, 7 of 12 pairs).
 */
export function spinningSessionConfig(steps: 'decode' | 'prompt'): Record<string, unknown> {
  const blocks = { dynamic_block_base: String(SPINNING_DYNAMIC_BLOCK_BASE) };
  if (steps === 'prompt') return { ...spinSessionConfig('run'), ...blocks };
  return { intra_op: { allow_spinning: '1', spin_duration_us: String(DECODE_SPIN_AFTER_STEP_US) }, ...blocks };
}
