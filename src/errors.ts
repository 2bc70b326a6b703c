// The one error taxonomy. Code below the routes throws ApiError with a kind;
// src/http/respond.ts maps kind + API family to a status and a body, in one place.

export type ApiFamily = 'platform' | 'inference';

export type ErrorKind =
  | 'invalid' // bad input: platform 422, inference 400
  | 'bad_json' // body is not JSON: 400 in both families
  | 'unauthenticated' // 401
  | 'forbidden' // 403
  | 'payment_required' // 402 (wallet at or below zero)
  | 'not_found' // 404
  | 'method_not_allowed' // 405
  | 'conflict' // 409 (state conflict: disk in use, invoice void, capacity gone)
  | 'payload_too_large' // 413
  | 'rate_limited' // 429 with Retry-After
  | 'overloaded' // 429: engine queue full
  | 'timeout' // 504: request deadline passed
  | 'request_timeout' // 408: the client did not send its body in time
  | 'unavailable' // 503: not ready, shutting down
  | 'internal'; // 500, never with internals in the body

export interface ApiErrorOptions {
  /** The request field at fault, dotted path (`messages.0.role`, `pod.gpuCount`). */
  param?: string;
  /** Inference error code (`invalid_model`, `context_length_exceeded`, ...). */
  code?: string;
  /** Inference error type override (default derived from kind). */
  type?: string;
  /** For 429s: how long the caller should wait. */
  retryAfterMs?: number;
  /** Extra response headers (e.g. rate-limit headers on a refusal). */
  headers?: Record<string, string>;
  /** Several field errors at once (platform bodies list them all). */
  issues?: FieldIssue[];
  cause?: unknown;
}

export interface FieldIssue {
  param: string;
  details: string;
}

export class ApiError extends Error {
  readonly kind: ErrorKind;
  readonly param?: string;
  readonly code?: string;
  readonly type?: string;
  readonly retryAfterMs?: number;
  readonly headers?: Record<string, string>;
  readonly issues?: FieldIssue[];

  constructor(kind: ErrorKind, message: string, opts: ApiErrorOptions = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'ApiError';
    this.kind = kind;
    this.param = opts.param;
    this.code = opts.code;
    this.type = opts.type;
    this.retryAfterMs = opts.retryAfterMs;
    this.headers = opts.headers;
    this.issues = opts.issues;
  }
}

/** The same error with more response headers (an inference id on every answer, errors included). */
export function withHeaders(e: ApiError, headers: Record<string, string>): ApiError {
  return new ApiError(e.kind, e.message, {
    param: e.param,
    code: e.code,
    type: e.type,
    retryAfterMs: e.retryAfterMs,
    issues: e.issues,
    cause: e.cause,
    headers: { ...e.headers, ...headers },
  });
}

/** Quote a given value for an error message, short enough to log. */
export function showValue(v: unknown): string {
  let s: string;
  try {
    s = typeof v === 'string' ? JSON.stringify(v) : JSON.stringify(v) ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > 120 ? `${s.slice(0, 117)}...` : s;
}

export const invalid = (param: string, rule: string, value: unknown, code?: string) =>
  new ApiError('invalid', `${param}: ${rule} (got ${showValue(value)})`, { param, code });

export const notFound = (what: string, id: string, code?: string) =>
  new ApiError('not_found', `${what} ${showValue(id)} not found`, { param: undefined, code });

export const conflict = (message: string, param?: string) => new ApiError('conflict', message, { param });
