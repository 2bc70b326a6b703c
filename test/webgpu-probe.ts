import * as ort from 'onnxruntime-node';

/**
 * Why onnxruntime's webgpu provider cannot run here, or undefined where it can: a session of
 * `model` (a file or its bytes) opens on it. Its tests run where a Vulkan device is found (a GPU
 * with its driver, or Mesa's lavapipe on the CPU: bench/README.md "GPU") and are skipped elsewhere.
 */
export async function webgpuMissing(model: string | Uint8Array): Promise<string | undefined> {
  try {
    const s = typeof model === 'string' ? await ort.InferenceSession.create(model, { executionProviders: ['webgpu'] }) : await ort.InferenceSession.create(model, { executionProviders: ['webgpu'] });
    await s.release();
    return undefined;
  } catch (e) {
    return (e as Error).message.split('\n')[0];
  }
}
