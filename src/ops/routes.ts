import type { Route } from '../http/router.js';
import { ApiError } from '../errors.js';
import fs from 'node:fs';
import { gauge, registries, type MetricsPort } from '../metrics.js';

// The daemon's version, from its package.json (dist/src/ops -> the repository root), read once.
export const VERSION: string = (() => {
  try {
    return JSON.parse(fs.readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')).version ?? 'unknown';
  } catch {
    return 'unknown';
  }
})();

/** A named readiness check: resolves when that part can serve, throws with a reason when not. */
export type ReadyCheck = { name: string; check: () => Promise<void> };

/** Why the daemon cannot recover by itself (its supervisor should restart it), or undefined while it can. */
export type Liveness = () => string | undefined;

export function opsRoutes(checks: ReadyCheck[], isShuttingDown: () => boolean, port: MetricsPort, failure: Liveness = () => undefined): Route[] {
  const registry = registries[port];
  // One build-info series per port (they differ in `server`), so either scrape alone says what runs.
  gauge({ name: 'cloudgate_build_info', help: 'Always 1: the daemon version and Node.js version serving this port', labelNames: ['server', 'version', 'node_version'] }, port).set(
    { server: port, version: VERSION, node_version: process.version },
    1,
  );
  const base = { method: 'GET' as const, family: 'platform' as const, auth: 'public' as const };
  // Liveness answers from memory, never from the database: a stalled database is /readyz's
  // business (traffic goes elsewhere), not a reason to restart the daemon. Only what the
  // daemon cannot recover from by itself (its embedded PostgreSQL will not restart) fails it.
  const live = () => {
    const why = failure();
    return why ? { status: 503, body: { status: 'unhealthy', reason: why } } : { body: { status: 'ok' } };
  };
  return [
    { ...base, path: '/healthz', handler: live },
    // vLLM's and llama.cpp's liveness path, for tools that probe it.
    { ...base, path: '/health', handler: live },
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
