import type { Route } from '../http/router.js';
import { ApiError } from '../errors.js';
import { registry } from '../metrics.js';

/** A named readiness check: resolves when that part can serve, throws with a reason when not. */
export type ReadyCheck = { name: string; check: () => Promise<void> };

export function opsRoutes(checks: ReadyCheck[], isShuttingDown: () => boolean): Route[] {
  const base = { method: 'GET' as const, family: 'platform' as const, auth: 'public' };
  return [
    { ...base, path: '/healthz', handler: () => ({ body: { status: 'ok' } }) },
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
