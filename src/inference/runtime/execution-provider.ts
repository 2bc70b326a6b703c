import type ort from 'onnxruntime-node';

/** onnxruntime's webgpu `validationMode`s, from no checks on the host to all of Dawn's. */
export const WEBGPU_VALIDATION_MODES = ['disabled', 'wgpuOnly', 'basic', 'full'] as const;
export type WebgpuValidationMode = (typeof WEBGPU_VALIDATION_MODES)[number];

/**
 * A session's `executionProviders` entry for `provider`: on webgpu, with the validation mode
 * where one is set (WEBGPU_VALIDATION_MODE); elsewhere, or unset, the provider's name alone.
 * The worker's sessions and the raw-loop benchmark's take it from here, so both run alike.
 */
export function providerEntry(provider: string, validationMode?: WebgpuValidationMode): ort.InferenceSession.ExecutionProviderConfig {
  return provider === 'webgpu' && validationMode ? ({ name: 'webgpu', validationMode } as ort.InferenceSession.ExecutionProviderConfig) : provider;
}
