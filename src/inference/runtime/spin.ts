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
