import * as ort from 'onnxruntime-node';

/**
 * Why onnxruntime's webgpu provider cannot run here, or undefined where it can: a session of
 * `model` (a file or its bytes, with `session` config entries) opens on it. Its tests run where a
 * Vulkan device is found (a GPU with its driver, or Mesa's lavapipe on the CPU: bench/README.md
 * "GPU") and are skipped elsewhere.
 */
export async function webgpuMissing(model: string | Uint8Array, session: Record<string, string> = {}): Promise<string | undefined> {
  const opts = { executionProviders: ['webgpu'], extra: { session } };
  try {
    const s = typeof model === 'string' ? await ort.InferenceSession.create(model, opts) : await ort.InferenceSession.create(model, opts);
    await s.release();
    return undefined;
  } catch (e) {
    return (e as Error).message.split('\n')[0];
  }
}
