import { ApiError, type ApiFamily, type ErrorKind } from '../errors.js';
import { log } from '../log.js';
import type { Ctx } from './context.js';
import type { Reply } from './router.js';

// The one place an error becomes HTTP: status, body shape (by API family) and headers.

const statusOf: Record<ErrorKind, number> = {
  invalid: 422, // platform; inference overrides to 400 below
  bad_json: 400,
  unauthenticated: 401,
  payment_required: 402,
  forbidden: 403,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  payload_too_large: 413,
  rate_limited: 429,
  overloaded: 429,
  internal: 500,
  unavailable: 503,
  timeout: 504,
  request_timeout: 408,
};

const inferenceType: Record<ErrorKind, string> = {
  invalid: 'invalid_request_error',
  bad_json: 'invalid_request_error',
  not_found: 'invalid_request_error',
  method_not_allowed: 'invalid_request_error',
  conflict: 'invalid_request_error',
  payload_too_large: 'invalid_request_error',
  unauthenticated: 'authentication_error',
  forbidden: 'permission_error',
  payment_required: 'insufficient_quota',
  rate_limited: 'rate_limit_error',
  overloaded: 'rate_limit_error',
  timeout: 'timeout_error',
  request_timeout: 'invalid_request_error',
  unavailable: 'server_error',
  internal: 'server_error',
};

const defaultCode: Record<ErrorKind, string> = {
  invalid: 'invalid_value',
  bad_json: 'invalid_json',
  not_found: 'not_found',
  method_not_allowed: 'method_not_allowed',
  conflict: 'conflict',
  payload_too_large: 'payload_too_large',
  unauthenticated: 'invalid_api_key',
  forbidden: 'insufficient_permissions',
  payment_required: 'insufficient_quota',
  rate_limited: 'rate_limit_exceeded',
  overloaded: 'engine_overloaded',
  timeout: 'timeout',
  request_timeout: 'request_timeout',
  unavailable: 'service_unavailable',
  internal: 'internal_error',
};

export interface HttpError {
  status: number;
  body: unknown;
  headers: Record<string, string>;
}

export function toHttpError(err: unknown, family: ApiFamily): HttpError {
  const e =
    err instanceof ApiError ? err : new ApiError('internal', 'internal server error; the request id identifies it in our logs');
  let status = statusOf[e.kind];
  if (e.kind === 'invalid' && family === 'inference') status = 400;
  const headers: Record<string, string> = { ...e.headers };
  if (e.retryAfterMs !== undefined) {
    headers['retry-after'] = String(Math.max(1, Math.ceil(e.retryAfterMs / 1000)));
    headers['retry-after-ms'] = String(Math.max(0, Math.round(e.retryAfterMs)));
  }
  if (e.kind === 'payment_required') headers['x-should-retry'] = 'false';
  const body =
    family === 'inference'
      ? { error: { message: e.message, type: e.type ?? inferenceType[e.kind], code: e.code ?? defaultCode[e.kind], param: e.param ?? null } }
      : { errors: e.issues ?? [{ param: e.param ?? '', details: e.message }] };
  return { status, body, headers };
}

/** The log line's answer to "why did this fail": our error kind and the code the client saw. */
export function noteError(ctx: Ctx, err: unknown): void {
  const e = err instanceof ApiError ? err : undefined;
  const kind = e?.kind ?? 'internal';
  ctx.note({ errorType: kind, errorCode: e?.code ?? defaultCode[kind] });
}

/** Answers with the error; `close` ends the connection after it (a client that misbehaved on it). */
export function sendError(ctx: Ctx, err: unknown, close = false): void {
  if (!(err instanceof ApiError)) {
    log.error({ reqId: ctx.requestId, route: ctx.route, err }, 'unhandled error');
  }
  const h = toHttpError(err, ctx.family);
  noteError(ctx, err);
  ctx.send(h.status, JSON.stringify(h.body), 'application/json', h.headers, close);
}

export function sendReply(ctx: Ctx, reply: Reply): void {
  const status = reply.status ?? 200;
  if (reply.raw !== undefined) {
    ctx.send(status, reply.raw, reply.contentType ?? 'application/json', reply.headers);
    return;
  }
  const body = reply.body === undefined ? '' : JSON.stringify(reply.body);
  ctx.send(status, body, reply.contentType ?? 'application/json', reply.headers);
}
