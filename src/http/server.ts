import { randomUUID } from 'node:crypto';
import { ApiError, type ApiFamily } from '../errors.js';
import { accessLog, log } from '../log.js';
import { counter, histogram, REQUEST_SECONDS_BUCKETS, type MetricsPort } from '../metrics.js';
import type { Authenticator } from '../auth/authenticator.js';
import { can } from '../auth/principal.js';
import { Ctx, Query } from './context.js';
import { corsHeaders, preflightHeaders, type CorsOrigins } from './cors.js';
import { parseQuery } from './query.js';
import type { ResponseCheck } from './response-check.js';
import { sendError, sendReply, toHttpError } from './respond.js';
import type { Match, Method, Router } from './router.js';
import { loadUws, type HttpResponse, type HttpRequest, type us_listen_socket } from './uws.js';

/** The HTTP metrics of one port, in that port's registry (src/metrics.ts: no series on both ports). */
function httpMetrics(port: MetricsPort) {
  return {
    requests: counter(
      { name: 'http_requests_total', help: 'HTTP requests answered, by route pattern, method and status', labelNames: ['server', 'route', 'method', 'status'] },
      port,
    ),
    duration: histogram(
      {
        name: 'http_request_duration_seconds',
        help: 'Time from request to the end of its response (a stream: its whole length), by route pattern',
        labelNames: ['server', 'route', 'method'],
        // Sub-millisecond reads up to streams of many minutes.
        buckets: [0.0005, 0.001, 0.0025, ...REQUEST_SECONDS_BUCKETS],
      },
      port,
    ),
  };
}

// Routes x methods x statuses actually seen is a few hundred; the bound only
// stops odd methods sent by a client from growing the map.
const METRIC_CHILDREN_MAX = 4096;
// Deadlines are honoured within this much: they are tens of seconds long.
const DEADLINE_TICK_MS = 25;
interface Deadline {
  ctx: Ctx;
  at: number;
  ms: number;
  /** A body deadline: the body must have arrived by `at` (408, connection closed). */
  body?: boolean;
}
const BODY_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
// After a 413 the rest of the body is read and dropped, so the client gets to read
// our answer instead of a reset; past this many bytes we stop paying for its upload.
const DRAIN_BYTES_MAX = 64 * 1024 * 1024;
const EMPTY = Buffer.alloc(0);
// Client-supplied request ids are kept when they are short and plain, so traces join up.
const REQUEST_ID_RE = /^[A-Za-z0-9._:-]{1,128}$/;

export interface ServerOptions {
  name: 'platform' | 'inference';
  host: string;
  port: number;
  family: ApiFamily;
  router: Router;
  auth: Authenticator;
  bodyBytesMax: number;
  timeoutMs: number;
  /** A request's body must arrive within this (BODY_TIMEOUT_MS): a slow sender gets 408. */
  bodyTimeoutMs: number;
  /** Requests one client address may have in flight (CLIENT_INFLIGHT_MAX); 0: no cap. */
  clientInflightMax: number;
  /** Browser origins allowed (CORS_ORIGINS); an empty set answers no preflight. */
  cors?: CorsOrigins;
  /** Appended to a 404's message: where this address's API lives. */
  notFoundHint?: string;
  /** CHECK_RESPONSE_SCHEMAS: every answer checked against its route's declaration. */
  check?: ResponseCheck;
}

/** One listening address: routes, limits, auth, logging, metrics, graceful close. */
export class HttpServer {
  private listenSocket: us_listen_socket | undefined;
  /** The requests in flight: a drain waits for none, and the end of a shutdown's grace tells each of them. */
  private readonly live = new Set<Ctx>();
  /** Requests in flight per client address, for CLIENT_INFLIGHT_MAX. */
  private readonly perClient = new Map<string, number>();
  private readonly deadlines = new Set<Deadline>();
  private deadlineTimer: NodeJS.Timeout | undefined;
  /** Label-bound metric children by route, method and status: a hit skips prom-client's label hashing. */
  private readonly metricChildren = new Map<string, { requests: { inc(): void }; duration: { observe(v: number): void } }>();
  private readonly metrics;
  private drainWaiters: Array<() => void> = [];
  private readonly app;
  port = 0;

  constructor(private readonly opts: ServerOptions) {
    this.metrics = httpMetrics(opts.name);
    const uws = loadUws();
    this.app = uws.App();
    this.app.any('/*', (res, req) => this.onRequest(res, req));
  }

  listen(): Promise<number> {
    const uws = loadUws();
    return new Promise((resolve, reject) => {
      this.app.listen(this.opts.host, this.opts.port, (sock) => {
        if (!sock) return reject(new Error(`${this.opts.name} API: cannot listen on ${this.opts.host}:${this.opts.port}`));
        this.listenSocket = sock;
        this.port = uws.us_socket_local_port(sock as never);
        resolve(this.port);
      });
    });
  }

  /** Stops accepting connections; in-flight requests go on. */
  stopAccepting(): void {
    if (!this.listenSocket) return;
    loadUws().us_listen_socket_close(this.listenSocket);
    this.listenSocket = undefined;
  }

  /** Resolves when no request is in flight, or at the deadline. */
  async drain(deadlineMs: number): Promise<boolean> {
    if (this.live.size === 0) return true;
    return Promise.race([
      new Promise<boolean>((r) => this.drainWaiters.push(() => r(true))),
      new Promise<boolean>((r) => setTimeout(() => r(false), deadlineMs).unref()),
    ]);
  }

  /**
   * Ends every request in flight with `err` (the shutdown's grace is over): one not
   * answered yet gets it as its response, a stream in-band from its handler.
   */
  abortInflight(err: ApiError): void {
    for (const ctx of this.live) {
      ctx.cancel(err);
      if (!ctx.responded && !ctx.aborted) sendError(ctx, err);
    }
  }

  close(): void {
    this.stopAccepting();
    (this.app as unknown as { close(): void }).close();
  }

  private onRequest(res: HttpResponse, req: HttpRequest): void {
    const method = req.getCaseSensitiveMethod().toUpperCase();
    const path = req.getUrl();
    const headers: Record<string, string> = {};
    req.forEach((k, v) => {
      headers[k] = v;
    });
    const given = headers['x-request-id'];
    const requestId = given && REQUEST_ID_RE.test(given) ? given : randomUUID();
    const ctx = new Ctx(res, method, path, new Query(req.getQuery() ?? ''), headers, requestId, this.opts.family);
    res.onAborted(() => ctx.markAborted());
    const cors = this.opts.cors;
    if (cors && (cors === '*' || cors.size > 0)) {
      const origin = headers.origin;
      if (method === 'OPTIONS' && headers['access-control-request-method']) {
        const pre = preflightHeaders(cors, origin, headers['access-control-request-headers']);
        if (pre) {
          ctx.send(204, '', 'text/plain', pre);
          return;
        }
      }
      ctx.extraHeaders = corsHeaders(cors, origin);
    }
    const { match, allowed } = this.opts.router.match(method, path);
    if (this.opts.check) this.inspect(ctx, this.opts.check);
    if (match) {
      ctx.matched = match.route;
      ctx.route = match.route.path;
      ctx.params = match.params;
      ctx.family = match.route.family;
    }
    this.live.add(ctx);
    const capped = this.admitClient(ctx, res);
    const done = this.readBody(ctx, method, match) ?? capped;
    void this.handle(ctx, match, allowed, done).finally(() => this.finish(ctx));
  }

  /** CHECK_RESPONSE_SCHEMAS: a mismatch is logged (the test harness fails on the line) and a success answer becomes a 500. */
  private inspect(ctx: Ctx, check: ResponseCheck): void {
    const report = (status: number, issue: string) => {
      log.error({ reqId: ctx.requestId, route: ctx.route, method: ctx.method, status, issue }, 'response does not match its declared schema');
    };
    ctx.inspect = {
      whole: (status, contentType, body) => {
        const issue = check.check(ctx.matched, ctx.family, status, contentType, body);
        if (!issue) return undefined;
        report(status, issue);
        if (status >= 400) return undefined;
        return { status: 500, body: JSON.stringify(toHttpError(new ApiError('internal', `response schema mismatch (CHECK_RESPONSE_SCHEMAS): ${issue}`), ctx.family).body) };
      },
      event: (chunk) => {
        for (const line of chunk.split('\n')) {
          if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
          const issue = check.checkEvent(ctx.matched, ctx.family, line.slice(6));
          if (issue) report(ctx.status, `event: ${issue}`);
        }
      },
    };
  }

  /** Counts the request against its client's cap; the refusal to answer at once, if over it. */
  private admitClient(ctx: Ctx, res: HttpResponse): ApiError | undefined {
    const max = this.opts.clientInflightMax;
    if (max === 0) return undefined;
    const client = Buffer.from(res.getRemoteAddressAsText()).toString();
    const n = this.perClient.get(client) ?? 0;
    if (n >= max) {
      return new ApiError('rate_limited', `this client address has ${n} requests in flight, the limit (CLIENT_INFLIGHT_MAX); retry when one ends`, { retryAfterMs: 1_000 });
    }
    this.perClient.set(client, n + 1);
    ctx.client = client;
    return undefined;
  }

  /** Reads the body up to the route's limit; returns an error to answer at once, if any. */
  private readBody(ctx: Ctx, method: string, match: Match | undefined): ApiError | undefined {
    if (!BODY_METHODS.has(method)) {
      ctx.bodyDone(EMPTY);
      return undefined;
    }
    const limit = match?.route.bodyBytesMax ?? this.opts.bodyBytesMax;
    const tooLarge = (n: string) =>
      new ApiError('payload_too_large', `request body of ${n} bytes is over this route's limit of ${limit} bytes`, { param: 'body' });
    const declared = Number(ctx.header('content-length') ?? NaN);
    const chunks: Buffer[] = [];
    let size = 0;
    let over = declared > limit;
    // With its length known the body is copied into one buffer as it arrives: a copy of
    // 16 MiB at the end (Buffer.concat) held the event loop ~60 ms here (fresh pages).
    const whole = Number.isSafeInteger(declared) && declared > 0 && !over ? Buffer.allocUnsafe(declared) : undefined;
    ctx.res.onData((ab, isLast) => {
      size += ab.byteLength;
      if (over) {
        if (size > DRAIN_BYTES_MAX && !ctx.aborted) ctx.res.close();
        return;
      }
      if (size > limit) {
        over = true;
        const err = tooLarge(`more than ${limit}`);
        ctx.bodyFail(err);
        sendError(ctx, err);
        return;
      }
      // uWS reuses the chunk's memory after this callback: copy it.
      if (whole) {
        if (size > whole.length) {
          over = true;
          const err = new ApiError('invalid', `request body is longer than its content-length of ${whole.length} bytes`, { param: 'body' });
          ctx.bodyFail(err);
          sendError(ctx, err);
          return;
        }
        whole.set(new Uint8Array(ab), size - ab.byteLength);
        if (isLast) ctx.bodyDone(size === whole.length ? whole : whole.subarray(0, size));
        return;
      }
      chunks.push(Buffer.from(new Uint8Array(ab)));
      if (isLast) ctx.bodyDone(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    });
    if (over) {
      ctx.bodyFail(tooLarge(String(declared)));
      return tooLarge(String(declared));
    }
    this.deadlines.add({ ctx, at: performance.now() + this.opts.bodyTimeoutMs, ms: this.opts.bodyTimeoutMs, body: true });
    this.armDeadlines();
    return undefined;
  }

  private async handle(ctx: Ctx, match: Match | undefined, allowed: Method[], early: ApiError | undefined): Promise<void> {
    let deadline: Deadline | undefined;
    try {
      if (early) throw early;
      if (!match) {
        if (allowed.length) {
          throw new ApiError('method_not_allowed', `method ${ctx.method} is not allowed on ${ctx.path}; allowed: ${allowed.join(', ')}`, {
            headers: { allow: allowed.join(', ') },
          });
        }
        throw new ApiError('not_found', `no route for ${ctx.method} ${ctx.path}${this.opts.notFoundHint ?? ''}`);
      }
      const route = match.route;
      const timeoutMs = route.timeoutMs === undefined ? this.opts.timeoutMs : route.timeoutMs;
      if (timeoutMs !== null) {
        const d: Deadline = (deadline = { ctx, at: performance.now() + timeoutMs, ms: timeoutMs });
        this.deadlines.add(d);
        this.armDeadlines();
        const defaultMs = this.opts.timeoutMs;
        if (defaultMs < timeoutMs) {
          ctx.useDefaultDeadline = () => {
            d.at = ctx.startedAt + defaultMs;
            d.ms = defaultMs;
          };
        }
      }
      if (route.auth !== 'public') {
        ctx.principal = await this.opts.auth.authenticate(ctx.header('authorization'));
        if (route.auth !== 'authenticated' && !can(ctx.principal, route.auth)) {
          throw new ApiError('forbidden', `this API key lacks the permission ${route.auth}`, { param: 'authorization' });
        }
      }
      if (route.doc.query) ctx.parsedQuery = { schema: route.doc.query, value: parseQuery(route.doc.query, ctx.query) };
      const reply = await route.handler(ctx);
      if (reply) sendReply(ctx, reply);
      else if (!ctx.responded && !ctx.aborted) throw new Error(`handler for ${route.path} returned no reply`);
    } catch (e) {
      if (!ctx.responded && !ctx.aborted) sendError(ctx, e);
      else if (!(e instanceof ApiError)) log.error({ reqId: ctx.requestId, err: e }, 'error after response started');
    } finally {
      if (deadline) this.deadlines.delete(deadline);
    }
  }

  // Deadlines are checked by one timer every DEADLINE_TICK_MS instead of a
  // setTimeout per request: arming and clearing a timer per request cost
  // about as much as the rate limiter. The timer runs only while requests are in flight.
  private armDeadlines(): void {
    if (this.deadlineTimer) return;
    this.deadlineTimer = setInterval(() => {
      if (this.deadlines.size === 0) {
        clearInterval(this.deadlineTimer);
        this.deadlineTimer = undefined;
        return;
      }
      const now = performance.now();
      for (const d of this.deadlines) {
        if (d.body) {
          if (d.ctx.hasBody()) this.deadlines.delete(d);
          else if (d.at <= now) {
            this.deadlines.delete(d);
            const err = new ApiError('request_timeout', `the request body did not arrive within ${d.ms} ms (BODY_TIMEOUT_MS)`, { param: 'body' });
            d.ctx.bodyFail(err);
            if (!d.ctx.responded) sendError(d.ctx, err, true);
          }
          continue;
        }
        if (d.at > now) continue;
        this.deadlines.delete(d);
        const err = new ApiError('timeout', `request did not finish within ${d.ms} ms`);
        d.ctx.cancel(err);
        if (!d.ctx.responded) sendError(d.ctx, err);
      }
    }, DEADLINE_TICK_MS);
  }

  private finish(ctx: Ctx): void {
    const seconds = (performance.now() - ctx.startedAt) / 1000;
    const status = ctx.aborted && !ctx.responded ? 499 : ctx.status;
    const server = this.opts.name;
    const key = `${ctx.route}\u0000${ctx.method}\u0000${status}`;
    let m = this.metricChildren.get(key);
    if (!m) {
      m = {
        requests: this.metrics.requests.labels({ server, route: ctx.route, method: ctx.method, status: String(status) }),
        duration: this.metrics.duration.labels({ server, route: ctx.route, method: ctx.method }),
      };
      if (this.metricChildren.size < METRIC_CHILDREN_MAX) this.metricChildren.set(key, m);
    }
    m.requests.inc();
    m.duration.observe(seconds);
    const p = ctx.principal;
    accessLog.info(
      {
        reqId: ctx.requestId,
        server,
        method: ctx.method,
        route: ctx.route,
        status,
        ms: Math.round(seconds * 1e4) / 10,
        user: p?.userId,
        key: p?.keyId,
        // A path no route matched is what an operator needs to see (a client's typo, a missing /v1 alias).
        path: ctx.route === 'unmatched' ? ctx.path : undefined,
        ...ctx.logFields,
      },
      'request',
    );
    this.live.delete(ctx);
    if (ctx.client !== undefined) {
      const n = (this.perClient.get(ctx.client) ?? 1) - 1;
      if (n > 0) this.perClient.set(ctx.client, n);
      else this.perClient.delete(ctx.client);
    }
    if (this.live.size === 0) {
      const w = this.drainWaiters;
      this.drainWaiters = [];
      for (const f of w) f();
    }
  }
}
