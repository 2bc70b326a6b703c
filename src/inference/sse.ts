import type { ApiError } from '../errors.js';
import type { Ctx } from '../http/context.js';
import { noteError, toHttpError } from '../http/respond.js';

// Server-sent events as OpenAI frames them: `data: <json>\n\n` per event,
// `data: [DONE]\n\n` at the end. Writes wait on uWS backpressure.

export const SSE_HEADERS = { 'cache-control': 'no-cache', 'x-accel-buffering': 'no' };

export class SseStream {
  constructor(private readonly ctx: Ctx) {}

  start(headers: Record<string, string>): boolean {
    return this.ctx.beginStream(200, 'text/event-stream; charset=utf-8', { ...SSE_HEADERS, ...headers });
  }

  /** Resolves false once the client is gone; the caller stops producing. */
  send(event: unknown): Promise<boolean> {
    return this.ctx.write(`data: ${JSON.stringify(event)}\n\n`);
  }

  /** Ends the stream with an error frame (OpenAI's in-band error), and no [DONE]: it did not complete. */
  async fail(err: ApiError): Promise<void> {
    noteError(this.ctx, err);
    await this.ctx.write(`data: ${JSON.stringify(toHttpError(err, 'inference').body)}\n\n`);
    this.ctx.endStream();
  }

  async done(): Promise<void> {
    await this.ctx.write('data: [DONE]\n\n');
    this.ctx.endStream();
  }
}
