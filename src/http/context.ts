import type { z } from 'zod';
import { ApiError, type ApiFamily } from '../errors.js';
import type { HttpResponse } from './uws.js';
import type { Principal } from '../auth/principal.js';
import type { Route } from './router.js';

/** Query string parsed once; repeatable keys keep every value (`?pod_ids=a&pod_ids=b`). */
export class Query {
  private readonly map = new Map<string, string[]>();
  constructor(raw: string) {
    if (!raw) return;
    for (const [k, v] of new URLSearchParams(raw)) {
      const list = this.map.get(k);
      if (list) list.push(v);
      else this.map.set(k, [v]);
    }
  }
  get(key: string): string | undefined {
    return this.map.get(key)?.[0];
  }
  all(key: string): string[] {
    // `regions=a,b` is accepted beside repeated keys: both forms are common in clients.
    return (this.map.get(key) ?? []).flatMap((v) => v.split(',')).filter((v) => v !== '');
  }
  has(key: string): boolean {
    return this.map.has(key);
  }
  toObject(): Record<string, string | string[]> {
    const o: Record<string, string | string[]> = {};
    for (const [k, v] of this.map) o[k] = v.length === 1 ? v[0]! : v;
    return o;
  }
}

/**
 * Seconds a client may keep an idle connection for its next request, announced on every answer
 * (`Keep-Alive: timeout=5`, as nginx and Node's own server announce theirs). uWS closes a
 * connection idle for 10 s, checked every 4 s, so 8-12 s in practice (measured); a pooled client
 * that reuses one as it closes gets ECONNRESET, and a POST is not retried: a benchmark's 16 pooled
 * streams died so after a 9 s pause. Clients that read the hint (undici's fetch, Node's Agent with
 * a `timeout`) drop the connection first; 5 leaves 3 s to the earliest close.
 */
export const KEEP_ALIVE_HINT_S = 5;
const KEEP_ALIVE_HINT = `timeout=${KEEP_ALIVE_HINT_S}`;
/** `write`'s settled answers, shared: one per write was garbage for the HTTP thread's collector. */
const WRITTEN = Promise.resolve(true);
const NOT_WRITTEN = Promise.resolve(false);

/**
 * One request. Everything uWS offers only synchronously (method, url, headers)
 * is copied here before the first await; the response goes out through
 * `send`, corked and guarded against a client that already went away.
 */
export class Ctx {
  readonly startedAt = performance.now();
  params: Record<string, string> = {};
  principal!: Principal;
  /** Headers every answer to this request carries (CORS), set before routing. */
  extraHeaders: Record<string, string> | undefined;
  route = 'unmatched';
  status = 0;
  /**
   * Fields a handler adds to this request's access-log line (model, tokens,
   * finish reason, inference id, error code...): see `note`. Only values the
   * server picks, never headers, bodies or secrets.
   */
  readonly logFields: Record<string, string | number | boolean | null> = {};
  responded = false;
  aborted = false;
  private readonly abortController = new AbortController();
  private bodyBuf: Buffer | undefined;
  private bodyWaiters: Array<[(b: Buffer) => void, (e: unknown) => void]> = [];
  private bodyError: unknown;
  private jsonCache: unknown;
  private jsonParsed = false;
  private onWritableWaiter: (() => void) | undefined;
  private streamEnded = false;
  /**
   * Set by the server: gives this request the default deadline (REQUEST_TIMEOUT_MS,
   * from its start) in place of its route's. A route that may stream has the stream
   * deadline; its handler calls this once the body says it will not stream.
   */
  useDefaultDeadline: () => void = () => undefined;
  /** The client address counted against CLIENT_INFLIGHT_MAX, when that cap is on. */
  client: string | undefined;

  constructor(
    readonly res: HttpResponse,
    readonly method: string,
    readonly path: string,
    readonly query: Query,
    readonly headers: Record<string, string>,
    readonly requestId: string,
    public family: ApiFamily,
  ) {}

  /** The route this request matched (undefined for a 404 or 405). */
  matched: Route | undefined;
  /** CHECK_RESPONSE_SCHEMAS: sees every answer; returns a replacement for one that breaks its declaration. */
  inspect: { whole(status: number, contentType: string, body: string | Buffer): { status: number; body: string } | undefined; event(chunk: string): void } | undefined;

  /** The query as the route's `doc.query` parsed it (set by the server before the handler). */
  parsedQuery: { schema: z.ZodObject; value: unknown } | undefined;

  /** The parsed query; `schema` must be the one the route declares, so what is read is what is documented. */
  queryOf<S extends z.ZodObject>(schema: S): z.infer<S> {
    if (this.parsedQuery?.schema !== schema) throw new Error(`route ${this.route} reads a query schema it does not declare in doc.query`);
    return this.parsedQuery.value as z.infer<S>;
  }

  get signal(): AbortSignal {
    return this.abortController.signal;
  }

  /** Adds fields to this request's access-log line (later values replace earlier ones). */
  note(fields: Record<string, string | number | boolean | null | undefined>): void {
    for (const k in fields) {
      const v = fields[k];
      if (v !== undefined) this.logFields[k] = v;
    }
  }

  header(name: string): string | undefined {
    return this.headers[name];
  }

  /** Called by the server when the socket closes before we answered. */
  markAborted(): void {
    this.aborted = true;
    this.abortController.abort(new ApiError('unavailable', 'client closed the connection'));
    this.bodyFail(new ApiError('invalid', 'client closed the connection before sending the body'));
    this.onWritableWaiter?.();
  }

  /** Ends work for this request (deadline passed) without touching the socket. */
  cancel(reason: unknown): void {
    this.abortController.abort(reason);
  }

  bodyDone(buf: Buffer): void {
    this.bodyBuf = buf;
    for (const [ok] of this.bodyWaiters) ok(buf);
    this.bodyWaiters = [];
  }

  bodyFail(err: unknown): void {
    if (this.bodyBuf) return;
    this.bodyError = err;
    for (const [, fail] of this.bodyWaiters) fail(err);
    this.bodyWaiters = [];
  }

  /** The body's JSON value parsed elsewhere (a screening thread that took the bytes). */
  setJson(value: unknown): void {
    this.jsonParsed = true;
    this.jsonCache = value;
  }

  /** Whether the whole body has arrived (or failed). */
  hasBody(): boolean {
    return this.bodyBuf !== undefined || this.bodyError !== undefined;
  }

  body(): Promise<Buffer> {
    if (this.bodyBuf) return Promise.resolve(this.bodyBuf);
    if (this.bodyError) return Promise.reject(this.bodyError);
    return new Promise((ok, fail) => this.bodyWaiters.push([ok, fail]));
  }

  /** The body as JSON; an empty body is `undefined`; bad JSON is a 400 naming the position. */
  async json(): Promise<unknown> {
    if (this.jsonParsed) return this.jsonCache;
    const buf = await this.body();
    this.jsonParsed = true;
    if (buf.length === 0) return (this.jsonCache = undefined);
    try {
      this.jsonCache = JSON.parse(buf.toString('utf8'));
    } catch (e) {
      throw new ApiError('bad_json', `request body is not valid JSON: ${(e as Error).message}`, { param: 'body' });
    }
    return this.jsonCache;
  }

  /** Status line and headers; every answer carries its request id. Call inside cork. */
  private writeHead(status: number, contentType: string, headers?: Record<string, string>): void {
    this.res.writeStatus(statusLine(status));
    this.res.writeHeader('content-type', contentType);
    this.res.writeHeader('x-request-id', this.requestId);
    this.res.writeHeader('keep-alive', KEEP_ALIVE_HINT);
    if (this.extraHeaders) for (const k in this.extraHeaders) this.res.writeHeader(k, this.extraHeaders[k]!);
    if (headers) for (const k in headers) this.res.writeHeader(k, headers[k]!);
  }

  /** Writes a whole response once. Returns false when the client is gone. */
  send(status: number, body: string | Buffer, contentType: string, headers?: Record<string, string>, close = false): boolean {
    if (this.responded || this.aborted) return false;
    const replaced = this.inspect?.whole(status, contentType, body);
    if (replaced) ({ status, body } = replaced);
    this.responded = true;
    this.status = status;
    this.res.cork(() => {
      this.writeHead(status, contentType, headers);
      if (status === 204) this.res.endWithoutBody(0, close);
      else this.res.end(body, close);
    });
    return true;
  }

  /** Starts a streamed response (SSE): status and headers now, body by `write`. */
  beginStream(status: number, contentType: string, headers?: Record<string, string>): boolean {
    if (this.responded || this.aborted) return false;
    this.responded = true;
    this.status = status;
    this.res.cork(() => this.writeHead(status, contentType, headers));
    this.res.onWritable(() => {
      const w = this.onWritableWaiter;
      this.onWritableWaiter = undefined;
      w?.();
      return true;
    });
    return true;
  }

  /**
   * Writes a chunk of a streamed response; resolves once uWS has taken it
   * without backpressure, so a slow reader slows its producer instead of
   * growing our buffers. Resolves false when the client is gone.
   */
  write(chunk: string): Promise<boolean> {
    if (this.aborted) return NOT_WRITTEN;
    this.inspect?.event(chunk);
    this.writing = chunk;
    this.res.cork(this.corkedWrite);
    if (this.written) return WRITTEN;
    return new Promise<void>((resolve) => (this.onWritableWaiter = resolve)).then(() => !this.aborted);
  }

  /** `write`'s chunk and its answer, so that its cork callback is made once, not per write (a stream's writes are the HTTP thread's hottest path). */
  private writing = '';
  private written = false;
  private readonly corkedWrite = () => {
    this.written = this.res.write(this.writing);
    this.writing = '';
  };

  /** Ends a streamed response; safe to call twice or after the client left. */
  endStream(): void {
    if (this.aborted || this.streamEnded) return;
    this.streamEnded = true;
    this.res.cork(() => this.res.end());
  }
}

const reasons: Record<number, string> = {
  200: 'OK', 201: 'Created', 202: 'Accepted', 204: 'No Content', 400: 'Bad Request', 401: 'Unauthorized',
  402: 'Payment Required', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 409: 'Conflict',
  413: 'Payload Too Large', 422: 'Unprocessable Entity', 429: 'Too Many Requests', 500: 'Internal Server Error',
  503: 'Service Unavailable', 504: 'Gateway Timeout',
};

export function statusLine(status: number): string {
  return `${status} ${reasons[status] ?? 'Status'}`;
}
