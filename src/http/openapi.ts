import { z } from 'zod';
import type { ApiFamily } from '../errors.js';
import { responseKinds, type ResponseDoc, type Route } from './router.js';

// The OpenAPI 3.1 document of one listening address, generated from the routes it serves
// (each route's `doc`: the zod schemas its handler uses). JSON Schema 2020-12 is OpenAPI
// 3.1's own dialect, so zod's conversion goes in as it is.

type Json = Record<string, unknown>;

/** The error body of each family (src/http/respond.ts writes them). */
export const PlatformErrorBody = z.object({
  errors: z.array(z.object({ param: z.string().describe('the field at fault, dotted; empty when none'), details: z.string() })).min(1),
});
export const InferenceErrorBody = z.object({
  error: z.object({ message: z.string(), type: z.string(), code: z.string().nullable(), param: z.string().nullable() }),
});
export const errorBody = (family: ApiFamily) => (family === 'inference' ? InferenceErrorBody : PlatformErrorBody);

/** A zod schema as JSON Schema: `input` for what clients send, `output` for what we answer. */
export function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): Json {
  const s = z.toJSONSchema(schema, { io, unrepresentable: 'any', target: 'draft-2020-12' }) as Json;
  delete s.$schema;
  return s;
}

/** `/api/v1/pods/:podId` as OpenAPI writes it, `/api/v1/pods/{podId}`. */
export const openApiPath = (path: string) => path.replace(/[:*]([A-Za-z0-9_]+)/g, '{$1}');

const pathParams = (path: string) => [...path.matchAll(/[:*]([A-Za-z0-9_]+)/g)].map((m) => ({ name: m[1]!, rest: m[0].startsWith('*') }));

const operationId = (r: Route) =>
  (r.method.toLowerCase() + r.path.replace(/[:*]([A-Za-z0-9_]+)/g, 'By_$1')).replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ? c.toUpperCase() : ''));

function content(doc: ResponseDoc): Json | undefined {
  const k = responseKinds(doc);
  const c: Json = {};
  if (k.json) c['application/json'] = { schema: jsonSchema(k.json, 'output') };
  // OpenAPI 3.1 has no schema for one event: `x-event-schema` is that of each `data:` line
  // (what 3.2 calls itemSchema); the stream itself is text.
  if (k.sse) c['text/event-stream'] = { schema: { type: 'string' }, 'x-event-schema': jsonSchema(k.sse, 'output') };
  if (k.text) c[k.text] = { schema: { type: 'string' } };
  return Object.keys(c).length ? c : undefined;
}

const REASONS: Record<number, string> = { 200: 'OK', 201: 'Created', 202: 'Accepted', 204: 'No content', 503: 'Not ready' };

function operation(r: Route): Json {
  const d = r.doc;
  const parameters: Json[] = pathParams(r.path).map((p) => ({
    name: p.name,
    in: 'path',
    required: true,
    schema: { type: 'string' },
    ...(p.rest ? { description: 'the rest of the path, slashes included' } : {}),
  }));
  if (d.query) {
    const q = jsonSchema(d.query, 'input') as { properties?: Record<string, Json>; required?: string[] };
    for (const [name, schema] of Object.entries(q.properties ?? {})) {
      const { description, ...rest } = schema;
      parameters.push({
        name,
        in: 'query',
        required: q.required?.includes(name) ?? false,
        schema: rest,
        ...(description ? { description } : {}),
        // Lists are sent as repeated names (`a=x&a=y`); `a=x,y` is accepted too.
        ...(rest.type === 'array' ? { style: 'form', explode: true } : {}),
      });
    }
  }
  for (const [name, description] of Object.entries(d.headers ?? {})) parameters.push({ name, in: 'header', required: false, schema: { type: 'string' }, description });
  const responses: Json = {};
  for (const [status, doc] of Object.entries(d.responses)) {
    if (!doc) continue;
    const c = content(doc);
    responses[status] = { description: REASONS[Number(status)] ?? 'Answer', ...(c ? { content: c } : {}) };
  }
  responses.default = {
    description: 'An error: the status says which kind, the body names the field, the rule and the value given',
    content: { 'application/json': { schema: { $ref: `#/components/schemas/${r.family === 'inference' ? 'InferenceError' : 'PlatformError'}` } } },
  };
  return {
    operationId: operationId(r),
    summary: d.summary,
    tags: [d.tag],
    ...(r.auth === 'public' ? { security: [] } : {}),
    'x-permission': r.auth,
    ...(parameters.length ? { parameters } : {}),
    ...(d.body ? { requestBody: { required: true, content: { 'application/json': { schema: jsonSchema(d.body, 'input') } } } } : {}),
    responses,
  };
}

export interface ApiInfo {
  title: string;
  version: string;
  description: string;
}

/** The document for the routes one address serves. */
export function openApiDocument(routes: Route[], info: ApiInfo): Json {
  const paths: Record<string, Json> = {};
  for (const r of routes) {
    const p = (paths[openApiPath(r.path)] ??= {});
    p[r.method.toLowerCase()] = operation(r);
  }
  return {
    openapi: '3.1.0',
    info,
    paths,
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'An API key: `Authorization: Bearer <key>`' } },
      schemas: { PlatformError: jsonSchema(PlatformErrorBody, 'output'), InferenceError: jsonSchema(InferenceErrorBody, 'output') },
    },
    security: [{ bearer: [] }],
  };
}
