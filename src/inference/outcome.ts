import { ApiError } from '../errors.js';
import { engineError, type GenerateEvent } from './engine-api.js';

type Done = Extract<GenerateEvent, { type: 'done' }>;

/**
 * What a generation that did not finish tells its client, kept apart as vLLM keeps
 * them: the engine failed (500, or 503 while its worker restarts), or the request was
 * cut by its deadline (504) or a shutdown (503). Undefined when the client left:
 * there is no one to tell.
 */
export function unfinished(ev: Done, signal: AbortSignal, clientGone: boolean): ApiError | undefined {
  if (ev.finishReason === 'failed') return engineError(ev.failure ?? { message: 'the model failed while running this request', retryable: false });
  if (ev.finishReason !== 'cancelled' || clientGone) return undefined;
  const why = signal.reason;
  return why instanceof ApiError ? why : new ApiError('unavailable', 'generation was stopped before it finished');
}
