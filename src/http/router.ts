import { z } from 'zod';
import type { ApiFamily } from '../errors.js';
import type { Ctx } from './context.js';
import type { Permission } from '../auth/principal.js';

/** Who may call a route: one permission, any valid key, or anyone. Typed, so a misspelt permission does not compile. */
export type RouteAuth = Permission | 'authenticated' | 'public';

export type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

export interface Reply {
  status?: number;
  /** Serialised as JSON unless `raw` is given. `undefined` with status 204 sends no body. */
  body?: unknown;
  /** Pre-serialised body with its content type (metrics text, cached JSON). */
  raw?: string | Buffer;
  contentType?: string;
  headers?: Record<string, string>;
}

/**
 * A success answer as /openapi.json declares it: a JSON document of a schema (a zod schema
 * alone says that), or any of JSON, a server-sent event stream whose `data:` lines are
 * documents of a schema, text of a content type, or no body.
 */
export type ResponseDoc = z.ZodType | ResponseKinds;
export interface ResponseKinds {
  json?: z.ZodType;
  sse?: z.ZodType;
  text?: string;
  empty?: true;
}
export const responseKinds = (d: ResponseDoc): ResponseKinds => ('_zod' in d ? { json: d as z.ZodType } : (d as ResponseKinds));

/**
 * What a route takes and answers, from the zod schemas its handler uses: /openapi.json is
 * generated from it (src/http/openapi.ts), and with CHECK_RESPONSE_SCHEMAS=1 every answer is
 * checked against it (the end-to-end suite runs that way). Path parameters come from the path.
 * Error answers are the family's error body and need not be listed.
 */
export interface RouteDoc {
  /** One line: what the route does. */
  summary: string;
  /** Grouping in the document (`pods`, `chat`, ...). */
  tag: string;
  /** The request body's schema (its input side: what a client sends). */
  body?: z.ZodType;
  /** The query parameters: parsed by the server before the handler, read with `ctx.queryOf`. */
  query?: z.ZodObject;
  /** Request headers the route reads beyond Authorization, by lower-case name: what each does. */
  headers?: Record<string, string>;
  /** Success answers by status. */
  responses: Partial<Record<number, ResponseDoc>>;
}

/** A route's description in one call: `routeDoc('pods', 'One pod', { 200: Pod })`. */
export const routeDoc = (tag: string, summary: string, responses: RouteDoc['responses'], extra: Pick<RouteDoc, 'body' | 'query' | 'headers'> = {}): RouteDoc => ({
  tag,
  summary,
  responses,
  ...extra,
});

/** The admin answers' envelope, `{data, status}`; `status` is 'success' unless the route says which. */
export const adminEnvelope = (data: z.ZodType, statuses: [string, ...string[]] = ['success']) => z.object({ data, status: z.enum(statuses) });

/** A platform-family route; `extra` sets its own body limit or deadline. */
export const platformRoute = (method: Method, path: string, auth: RouteAuth, doc: RouteDoc, handler: Handler, extra: Partial<Route> = {}): Route => ({
  method,
  path,
  family: 'platform',
  auth,
  doc,
  handler,
  ...extra,
});

/** A handler returns a Reply, or undefined when it wrote the response itself (SSE). */
export type Handler = (ctx: Ctx) => Promise<Reply | undefined> | Reply | undefined;

export interface Route {
  method: Method;
  /** `/api/v1/pods/:podId`; a final `*name` captures the rest, slashes included. */
  path: string;
  family: ApiFamily;
  /** A permission (`instances:read`), `'authenticated'` (any valid key), or `'public'`. */
  auth: RouteAuth;
  handler: Handler;
  /** Its description: required, so a route cannot exist without one. */
  doc: RouteDoc;
  /** Body limit for this route; the server default otherwise. */
  bodyBytesMax?: number;
  /** Deadline for this route; null for handlers that manage their own (streams). */
  timeoutMs?: number | null;
}

export interface Match {
  route: Route;
  params: Record<string, string>;
}

interface Compiled {
  route: Route;
  segments: string[]; // literal, ':name' or '*name'
}

/** Strip one trailing slash so `/api/v1/pods` and `/api/v1/pods/` are the same route. */
function normalise(path: string): string {
  return path.length > 1 && path.endsWith('/') ? path.slice(0, -1) : path;
}

function decode(seg: string): string | null {
  if (!seg.includes('%')) return seg;
  try {
    return decodeURIComponent(seg);
  } catch {
    return null;
  }
}

export class Router {
  /** Every route, in registration order (for the OpenAPI document). */
  readonly routes: Route[] = [];
  private readonly statics = new Map<string, Route>();
  private readonly dynamic: Compiled[] = [];
  private readonly pathsSeen = new Map<string, Set<Method>>();

  add(route: Route): this {
    const path = normalise(route.path);
    const key = `${route.method} ${path}`;
    this.routes.push(route);
    if (!path.includes(':') && !path.includes('*')) {
      if (this.statics.has(key)) throw new Error(`duplicate route ${key}`);
      this.statics.set(key, route);
    } else {
      this.dynamic.push({ route, segments: path.split('/').slice(1) });
    }
    return this;
  }

  addAll(routes: Route[]): this {
    for (const r of routes) this.add(r);
    return this;
  }

  /** Finds the route; `allowed` lists methods that would match the path (for 405). */
  match(method: string, rawPath: string): { match?: Match; allowed: Method[] } {
    const path = normalise(rawPath);
    const hit = this.statics.get(`${method} ${path}`);
    if (hit) return { match: { route: hit, params: {} }, allowed: [] };
    const parts = path.split('/').slice(1);
    const allowed: Method[] = [];
    for (const [k, r] of this.statics) if (k.slice(k.indexOf(' ') + 1) === path) allowed.push(r.method);
    // Literal-first: routes are tried in registration order, so register `/pods/history` before `/pods/:id`.
    for (const c of this.dynamic) {
      const params = matchSegments(c.segments, parts);
      if (!params) continue;
      if (c.route.method === method) return { match: { route: c.route, params }, allowed: [] };
      allowed.push(c.route.method);
    }
    return { allowed };
  }
}

function matchSegments(pattern: string[], parts: string[]): Record<string, string> | null {
  const params: Record<string, string> = {};
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i]!;
    if (p.startsWith('*')) {
      const rest = parts.slice(i);
      if (rest.length === 0 || rest.some((s) => s === '')) return null;
      const decoded = rest.map(decode);
      if (decoded.some((d) => d === null)) return null;
      params[p.slice(1)] = decoded.join('/');
      return params;
    }
    const part = parts[i];
    if (part === undefined) return null;
    if (p.startsWith(':')) {
      if (part === '') return null;
      const d = decode(part);
      if (d === null) return null;
      params[p.slice(1)] = d;
    } else if (p !== part) return null;
  }
  return parts.length === pattern.length ? params : null;
}

// Checked by every build: a misspelt permission is not a RouteAuth (the route
// would otherwise be refused to every key, silently).
// @ts-expect-error 'instance:read' is not a permission ('instances:read' is)
const misspelt: RouteAuth = 'instance:read';
void misspelt;
