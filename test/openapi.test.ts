import { describe, expect, it } from 'vitest';
import { Validator } from '@seriousme/openapi-schema-validator';
import fs from 'node:fs';
import { call, daemon, newUser } from './helpers.js';

// /openapi.json on each address: a valid OpenAPI 3.1 document (checked by a real validator)
// of exactly the routes that address serves. That every answer keeps its declaration is
// checked on every request of the end-to-end suite (CHECK_RESPONSE_SCHEMAS, test/daemon.ts).

type Doc = { openapi: string; paths: Record<string, Record<string, { operationId: string; responses: Record<string, unknown>; parameters?: Array<{ name: string; in: string }> }>> };

describe.each(['platform', 'inference'] as const)('GET /openapi.json on the %s address', (base) => {
  it('is a valid OpenAPI 3.1 document, needs no key, and names every operation once', async () => {
    const r = await call<Doc>(base, 'GET', '/openapi.json', { key: null });
    expect(r.status).toBe(200);
    expect(r.body.openapi).toBe('3.1.0');
    const v = await new Validator().validate(r.body as never);
    expect(v.errors ?? []).toEqual([]);
    expect(v.valid).toBe(true);
    const ids = Object.values(r.body.paths).flatMap((p) => Object.values(p).map((o) => o.operationId));
    expect(new Set(ids).size).toBe(ids.length);
    for (const ops of Object.values(r.body.paths)) for (const o of Object.values(ops)) expect(Object.keys(o.responses).some((s) => /^2\d\d$/.test(s))).toBe(true);
  });

  it('describes routes this address serves and none it does not', async () => {
    const { body } = await call<Doc>(base, 'GET', '/openapi.json', { key: null });
    const paths = Object.keys(body.paths);
    if (base === 'inference') {
      expect(paths).toEqual(expect.arrayContaining(['/v1/chat/completions', '/api/v1/chat/completions', '/v4/ai/evaluation-model', '/v1/models/{modelId}', '/tokenize']));
      expect(paths.some((p) => p.startsWith('/api/v1/pods') || p.startsWith('/api/admin'))).toBe(false);
    } else {
      expect(paths).toEqual(expect.arrayContaining(['/api/v1/pods', '/api/v1/pods/{podId}', '/api/admin/api-keys', '/api/v1/billing/wallet']));
      expect(paths.some((p) => p.includes('chat/completions'))).toBe(false);
    }
    // Every documented operation is served (unauthenticated, most answer 401; none 'no route').
    for (const [path, ops] of Object.entries(body.paths)) {
      for (const method of Object.keys(ops)) {
        const concrete = path.replace(/\{[^}]+\}/g, 'x');
        const r = await call(base, method.toUpperCase(), concrete, { key: null });
        expect(JSON.stringify(r.body ?? '').includes('no route for'), `${method} ${path}`).toBe(false);
      }
    }
  });

  it('lists query parameters with their bounds, from the schemas the server parses them with', async () => {
    const { body } = await call<Doc>(base, 'GET', '/openapi.json', { key: null });
    if (base === 'platform') {
      const gpus = body.paths['/api/v1/availability/gpus']!.get!;
      const pageSize = gpus.parameters!.find((p) => p.name === 'page_size') as unknown as { schema: { maximum: number; default: number } };
      expect(pageSize.schema).toMatchObject({ type: 'integer', minimum: 1, maximum: 100, default: 100 });
      const { key } = await newUser(['availability:read']);
      const over = await call('platform', 'GET', '/api/v1/availability/gpus?page_size=101', { key });
      expect(over.status).toBe(422);
      expect(over.body.errors[0].details).toBe('page_size: must be at most 100 (got "101")');
      const topup = body.paths['/api/admin/transactions/topup']!.post!;
      expect(topup.parameters).toEqual([expect.objectContaining({ name: 'idempotency-key', in: 'header' })]);
    } else {
      const chat = body.paths['/v1/chat/completions']!.post! as unknown as { requestBody: { content: Record<string, { schema: { properties: Record<string, unknown> } }> } };
      expect(Object.keys(chat.requestBody.content['application/json']!.schema.properties)).toEqual(expect.arrayContaining(['model', 'messages', 'stream', 'max_tokens']));
      // The request headers that change who pays, and the gateway's own, are documented with the routes that read them.
      const names = (p: string) => (body.paths[p]!.post!.parameters ?? []).filter((x) => x.in === 'header').map((x) => x.name);
      expect(names('/v1/chat/completions')).toEqual(['x-service-team-id', 'x-prime-team-id', 'x-rft-run-id']);
      expect(names('/v4/ai/evaluation-model')).toEqual(expect.arrayContaining(['ai-model-id', 'ai-evaluation-model-specification-version', 'x-service-team-id']));
    }
  });
});

describe('the end-to-end suite', () => {
  it("runs the shared daemon with every answer checked against its route's declaration", () => {
    const listening = fs.readFileSync(daemon().logFile, 'utf8').split('\n').find((l) => l.includes('"msg":"listening"'))!;
    expect(JSON.parse(listening)).toMatchObject({ checkResponseSchemas: true });
  });
});
