import type { Route } from '../http/router.js';
import { ApiError } from '../errors.js';
import fs from 'node:fs';
import { registry } from '../metrics.js';

// The daemon's version, from its package.json (dist/src/ops -> the repository root), read once.
const VERSION: string = (() => {
  try {
    return JSON.parse(fs.readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')).version ?? 'unknown';
  } catch {
    return 'unknown';
  }
})();

/** A named readiness check: resolves when that part can serve, throws with a reason when not. */
export type ReadyCheck = { name: string; check: () => Promise<void> };

export function opsRoutes(checks: ReadyCheck[], isShuttingDown: () => boolean): Route[] {
  const base = { method: 'GET' as const, family: 'platform' as const, auth: 'public' };
  return [
    { ...base, path: '/healthz', handler: () => ({ body: { status: 'ok' } }) },
    // vLLM's and llama.cpp's liveness path, for tools that probe it.
    { ...base, path: '/health', handler: () => ({ body: { status: 'ok' } }) },
    { ...base, path: '/version', handler: () => ({ body: { version: VERSION } }) },
    {
      ...base,
      path: '/readyz',
      handler: async () => {
        if (isShuttingDown()) throw new ApiError('unavailable', 'shutting down');
        const results = await Promise.all(
          checks.map(async (c) => {
            try {
              await c.check();
              return [c.name, 'ok'] as const;
            } catch (e) {
              return [c.name, (e as Error).message || 'not ready'] as const;
            }
          }),
        );
        const ready = results.every(([, r]) => r === 'ok');
        return { status: ready ? 200 : 503, body: { status: ready ? 'ready' : 'not_ready', checks: Object.fromEntries(results) } };
      },
    },
    {
      ...base,
      path: '/metrics',
      handler: async () => ({ raw: await registry.metrics(), contentType: registry.contentType }),
    },
  ];
}
