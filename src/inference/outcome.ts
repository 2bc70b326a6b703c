import { ApiError } from '../errors.js';
import { EngineFailed, EngineRefused, TemplateRefused, type EngineFailure, type GenerateEvent, type InferenceEngine } from './engine-api.js';

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

/** How long a client is asked to wait after a retryable failure: about a worker's restart (a model load). */
const ENGINE_RETRY_AFTER_MS = 2_000;

/** How long a client is asked to wait after a shutdown: another replica takes it at once (as app.ts tells requests cut by one). */
const SHUTDOWN_RETRY_AFTER_MS = 1_000;

/** A failure as the API reports it: 503 with Retry-After while the model comes back or the server stops, else 500. */
export const engineError = (f: EngineFailure): ApiError =>
  f.shuttingDown
    ? new ApiError('unavailable', f.message, { code: 'shutting_down', retryAfterMs: SHUTDOWN_RETRY_AFTER_MS })
    : f.retryable
      ? new ApiError('unavailable', f.message, { code: 'engine_restarting', retryAfterMs: ENGINE_RETRY_AFTER_MS })
      : new ApiError('internal', f.message, { code: 'engine_failed' });

/** The engine's own errors as the API reports them (the one place they become HTTP); anything else as it is. */
export function apiErrorOf(e: unknown): unknown {
  if (e instanceof EngineRefused) {
    return e.reason === 'model_down'
      ? new ApiError('unavailable', e.message, { code: 'model_down' })
      : new ApiError('overloaded', e.message, { retryAfterMs: e.retryAfterMs });
  }
  if (e instanceof EngineFailed) return engineError(e.failure);
  if (e instanceof TemplateRefused) return new ApiError('invalid', `messages: the model's chat template refused them: ${e.message}`, { param: 'messages' });
  return e;
}

/**
 * The engine port as the serving code uses it: the same engine, its errors turned into
 * API errors as they leave it (a generation's iterator, a scoring, a chat's rendering).
 */
export function servingEngine(engine: InferenceEngine): InferenceEngine {
  const mapped = <T>(p: Promise<T>) => p.catch((e: unknown) => Promise.reject(apiErrorOf(e)));
  return {
    list: () => engine.list(),
    model: (id) => engine.model(id),
    encodeChat: (m, messages) => mapped(engine.encodeChat(m, messages)),
    encodeText: (m, text, special) => engine.encodeText(m, text, special),
    encode: (m, text) => engine.encode(m, text),
    bosTokens: (m) => engine.bosTokens(m),
    decode: (m, ids) => engine.decode(m, ids),
    tokenStrings: (m, ids) => engine.tokenStrings(m, ids),
    tokenBytes: (m, id) => engine.tokenBytes(m, id),
    scoreBranches: (m, req) => mapped(engine.scoreBranches(m, req)),
    generate: (m, req) => {
      // A refusal is thrown at the call, as the engine throws it (the caller settles its admission then).
      let events: AsyncGenerator<GenerateEvent>;
      try {
        events = engine.generate(m, req);
      } catch (e) {
        throw apiErrorOf(e);
      }
      return mapEvents(events);
    },
  };
}

/**
 * The engine's event stream with its errors mapped. Each call goes straight to the engine's
 * iterator, so a `return()` before the first read still cancels the sequence (a generator
 * function wrapping it would finish without telling the engine).
 */
function mapEvents(events: AsyncGenerator<GenerateEvent>): AsyncGenerator<GenerateEvent> {
  const mapped = <T>(p: Promise<T>) => p.catch((e: unknown) => Promise.reject(apiErrorOf(e)));
  const it = {
    next: (...a: [] | [unknown]) => mapped(events.next(...a)),
    return: (v?: unknown) => mapped(events.return(v as never)),
    throw: (e?: unknown) => mapped(events.throw(e)),
    [Symbol.asyncIterator]: () => it,
  };
  return it as unknown as AsyncGenerator<GenerateEvent>;
}
