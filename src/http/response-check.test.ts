import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ResponseCheck } from './response-check.js';
import type { Route } from './router.js';

const Thing = z.object({ id: z.string(), count: z.number().int(), note: z.string().nullable() });
const route: Route = {
  method: 'GET',
  path: '/things/:id',
  family: 'platform',
  auth: 'public',
  doc: { tag: 't', summary: 's', responses: { 200: { json: Thing, sse: Thing }, 204: { empty: true }, 503: Thing } },
  handler: () => undefined,
};

describe('CHECK_RESPONSE_SCHEMAS', () => {
  it('passes an answer that keeps its declaration and names what breaks one', async () => {
    const c = await ResponseCheck.create();
    const json = 'application/json';
    expect(c.check(route, 'platform', 200, json, JSON.stringify({ id: 'a', count: 1, note: null }))).toBeUndefined();
    expect(c.check(route, 'platform', 200, json, JSON.stringify({ id: 'a', count: 1.5, note: null }))).toBe('/count must be integer');
    expect(c.check(route, 'platform', 200, json, JSON.stringify({ id: 'a', count: 1 }))).toBe("(root) must have required property 'note'");
    // An undeclared key is drift too: answers are closed objects.
    expect(c.check(route, 'platform', 200, json, JSON.stringify({ id: 'a', count: 1, note: null, extra: 1 }))).toBe('(root) must NOT have additional properties');
    expect(c.check(route, 'platform', 201, json, '{}')).toBe('status 201 is not declared (declared: 200, 204, 503)');
    expect(c.check(route, 'platform', 204, 'text/plain', '')).toBeUndefined();
    expect(c.check(route, 'platform', 200, 'text/plain', 'hi')).toBe('content type text/plain is not declared');
    // A declared error status uses its own schema; any other error, the family's error body.
    expect(c.check(route, 'platform', 503, json, JSON.stringify({ id: 'a', count: 1, note: 'down' }))).toBeUndefined();
    expect(c.check(route, 'platform', 404, json, JSON.stringify({ errors: [{ param: '', details: 'no' }] }))).toBeUndefined();
    expect(c.check(route, 'platform', 404, json, JSON.stringify({ error: { message: 'no' } }))).toBe("(root) must have required property 'errors'");
    expect(c.check(undefined, 'inference', 404, json, JSON.stringify({ error: { message: 'no', type: 'x', code: null, param: null } }))).toBeUndefined();
  });

  it('checks each event of a stream, an in-band error against the error body', async () => {
    const c = await ResponseCheck.create();
    expect(c.checkEvent(route, 'inference', JSON.stringify({ id: 'a', count: 2, note: 'x' }))).toBeUndefined();
    expect(c.checkEvent(route, 'inference', JSON.stringify({ id: 'a' }))).toBe("(root) must have required property 'count'");
    expect(c.checkEvent(route, 'inference', JSON.stringify({ error: { message: 'gone', type: 'server_error', code: 'engine_failed', param: null } }))).toBeUndefined();
  });
});
