import { ApiError, type ErrorKind, type FieldIssue } from '../errors.js';
import type { Ctx } from '../http/context.js';
import { JobThread } from './runtime/job-thread.js';
import type { ServedModel } from './engine-api.js';

/**
 * Bodies up to this size are parsed on the event loop (~2 ms at the measured
 * ~6 ms per MiB of JSON.parse); larger ones are screened on their own thread.
 */
export const BODY_INLINE_BYTES_MAX = 256 * 1024;

export interface ScreenJob {
  id: number;
  kind: 'chat' | 'completion' | 'evaluation';
  body: Uint8Array;
  models: ServedModel[];
  /** The gateway's ai-model-id header, for an evaluation body without `model`. */
  headerModel: string | undefined;
}
export type ScreenResult =
  | { id: number; value: unknown }
  | { id: number; error: { kind: ErrorKind; message: string; param?: string; code?: string; issues?: FieldIssue[] } };

/**
 * The request body as JSON, a large one screened off the event loop first: parsed,
 * validated and its text held against the model's context, so that what comes
 * back to this thread is either a refusal or a body small enough to fit a model.
 */
export class BodyScreen {
  private readonly thread = new JobThread<ScreenJob, ScreenResult>('../screen-worker.js', 'body screening thread');

  /** `models` is the fixed list served (it is sent with each job: the thread keeps no state). */
  constructor(private readonly models: ServedModel[]) {}

  async json(ctx: Ctx, kind: ScreenJob['kind']): Promise<unknown> {
    const body = await ctx.body();
    if (body.length <= BODY_INLINE_BYTES_MAX) return ctx.json();
    // A body in a buffer of its own moves to the thread without a copy (a 16 MiB copy held the loop ~60 ms).
    const transfer = body.byteOffset === 0 && body.byteLength === body.buffer.byteLength && body.buffer instanceof ArrayBuffer ? [body.buffer] : [];
    const r = await this.thread
      .run({ kind, body, models: this.models, headerModel: kind === 'evaluation' ? ctx.header('ai-model-id') : undefined }, transfer)
      .catch((): ScreenResult => ({ id: 0, error: { kind: 'internal', message: 'internal error while reading the request' } }));
    if ('error' in r) throw new ApiError(r.error.kind, r.error.message, { param: r.error.param, code: r.error.code, issues: r.error.issues });
    // The body went to the thread (transferred, not copied); its parsed value stands for it.
    ctx.setJson(r.value);
    return r.value;
  }
}
