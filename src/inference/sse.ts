import type { ApiError } from '../errors.js';
import type { Ctx } from '../http/context.js';
import { noteError, toHttpError } from '../http/respond.js';

// Server-sent events as OpenAI frames them: `data: <json>\n\n` per event,
// `data: [DONE]\n\n` at the end. Writes wait on uWS backpressure.
//
// The events of one turn of the event loop go out in one write: a decode run posts a
// few fast steps together (runtime/token-posts.ts), and the end of a stream is three or
// four events, so one write (one send to the socket, one wake of the reader) carries
// them all. Each write was the HTTP thread's largest cost at one stream of a small
// model (~56 us of a send on loopback, bench/README.md "Token posts").

/**
 * Shared settled answers of `send` (one per event would be garbage the HTTP thread's collector then
 * sweeps). A caller may test for SENT and go on without awaiting it: an await of a settled promise
 * still costs a reaction and a turn of the microtask queue, a token.
 */
export const SENT = Promise.resolve(true);
const GONE = Promise.resolve(false);

export const SSE_HEADERS = { 'cache-control': 'no-cache', 'x-accel-buffering': 'no' };

export class SseStream {
  /** Frames of this turn, written together when it ends. */
  private held = '';
  private flushScheduled = false;
  /** The last write while uWS still holds part of it (a slow reader): senders wait on it. */
  private backlog: Promise<boolean> | undefined;

  constructor(private readonly ctx: Ctx) {}

  start(headers: Record<string, string>): boolean {
    return this.ctx.beginStream(200, 'text/event-stream; charset=utf-8', { ...SSE_HEADERS, ...headers });
  }

  /**
   * Queues an event for this turn's write. Resolves false once the client is gone, and
   * waits while the reader is behind (uWS backpressure), so the caller stops or slows.
   */
  send(event: unknown): Promise<boolean> {
    return this.sendJson(JSON.stringify(event));
  }

  /** As `send`, for an event already written as JSON (a stream's per-token frame, serving-chat.ts ContentFrames). */
  sendJson(json: string): Promise<boolean> {
    if (this.ctx.aborted) return GONE;
    this.held += 'data: ' + json + '\n\n';
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(this.flushNow);
    }
    return this.backlog ?? SENT;
  }

  private readonly flushNow = () => void this.flush();

  /**
   * Writes what this turn queued, after the backlog (one write waits on uWS at a time, in
   * order); until it is taken whole it is the backlog.
   */
  private flush(): Promise<boolean> {
    this.flushScheduled = false;
    if (!this.held) return this.backlog ?? Promise.resolve(!this.ctx.aborted);
    const frames = this.held;
    this.held = '';
    const before = this.backlog;
    const w = before ? before.then((ok) => (ok ? this.ctx.write(frames) : false)) : this.ctx.write(frames);
    this.backlog = w;
    void w.then(() => {
      if (this.backlog === w) this.backlog = undefined;
    });
    return w;
  }

  /** Ends the stream with an error frame (OpenAI's in-band error), and no [DONE]: it did not complete. */
  async fail(err: ApiError): Promise<void> {
    noteError(this.ctx, err);
    this.held += `data: ${JSON.stringify(toHttpError(err, 'inference').body)}\n\n`;
    await this.flush();
    this.ctx.endStream();
  }

  async done(): Promise<void> {
    this.held += 'data: [DONE]\n\n';
    await this.flush();
    this.ctx.endStream();
  }
}

/**
 * The JSON of `make(text)` for any `text`, as `JSON.stringify` writes it, with everything but the
 * text written once: a stream's per-token frame (serving-chat.ts), where building and writing the
 * whole chunk each token was a fifth of what the HTTP thread allocated (bench/README.md "The HTTP
 * thread's turns under load"). `make` must place the string it is given once, as a JSON string value.
 */
export function jsonWithText(make: (text: string) => unknown): (text: string) => string {
  const mark = '\u0000cloudgate-text\u0000';
  const markJson = JSON.stringify(mark);
  const whole = JSON.stringify(make(mark));
  const at = whole.indexOf(markJson);
  if (at < 0 || whole.indexOf(markJson, at + 1) >= 0) return (text) => JSON.stringify(make(text));
  const head = whole.slice(0, at);
  const tail = whole.slice(at + markJson.length);
  return (text) => head + JSON.stringify(text) + tail;
}
