import { describe, expect, it } from 'vitest';
import { Router, type Route } from './router.js';

const r = (method: Route['method'], path: string): Route => ({ method, path, family: 'platform', auth: 'public', handler: () => ({}) });

describe('Router', () => {
  const router = new Router().addAll([
    r('GET', '/api/v1/pods'),
    r('GET', '/api/v1/pods/history'),
    r('GET', '/api/v1/pods/:podId'),
    r('DELETE', '/api/v1/pods/:podId'),
    r('GET', '/api/v1/models/*modelId'),
  ]);

  it('matches with and without the trailing slash', () => {
    expect(router.match('GET', '/api/v1/pods').match?.route.path).toBe('/api/v1/pods');
    expect(router.match('GET', '/api/v1/pods/').match?.route.path).toBe('/api/v1/pods');
  });

  it('prefers the literal segment registered first and decodes params', () => {
    expect(router.match('GET', '/api/v1/pods/history').match?.route.path).toBe('/api/v1/pods/history');
    expect(router.match('GET', '/api/v1/pods/a%20b').match?.params).toEqual({ podId: 'a b' });
  });

  it('captures slashes in a rest parameter, raw or %2F-encoded', () => {
    expect(router.match('GET', '/api/v1/models/org/m').match?.params).toEqual({ modelId: 'org/m' });
    expect(router.match('GET', '/api/v1/models/org%2Fm').match?.params).toEqual({ modelId: 'org/m' });
    expect(router.match('GET', '/api/v1/models/').match).toBeUndefined();
  });

  it('reports the allowed methods of a path matched by another method', () => {
    const m = router.match('PATCH', '/api/v1/pods/x');
    expect(m.match).toBeUndefined();
    expect(m.allowed.sort()).toEqual(['DELETE', 'GET']);
  });

  it('does not match extra or missing segments and rejects malformed escapes', () => {
    expect(router.match('GET', '/api/v1/pods/x/y').match).toBeUndefined();
    expect(router.match('GET', '/api/v1/pods/%E0%A4%A').match).toBeUndefined();
  });
});
