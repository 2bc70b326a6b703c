import { z } from 'zod';
import type { ApiFamily } from '../errors.js';
import { openApiDocument, type ApiInfo } from '../http/openapi.js';
import type { Route, Router } from '../http/router.js';
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

const Health = z.object({ status: z.enum(['ok', 'unhealthy']), reason: z.string().optional().describe('why the daemon cannot recover by itself') });
const Version = z.object({ version: z.string() });
const Readiness = z.object({ status: z.enum(['ready', 'not_ready']), checks: z.record(z.string(), z.string()).describe('each check: ok, or why not') });

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
  const liveDoc = { summary: 'Liveness: answers from memory, never from the database', tag: 'operations', responses: { 200: Health, 503: Health } };
  return [
    { ...base, path: '/healthz', doc: liveDoc, handler: live },
    // vLLM's and llama.cpp's liveness path, for tools that probe it.
    { ...base, path: '/health', doc: liveDoc, handler: live },
    { ...base, path: '/version', doc: { summary: 'The daemon version', tag: 'operations', responses: { 200: Version } }, handler: () => ({ body: { version: VERSION } }) },
    {
      ...base,
      path: '/readyz',
      doc: { summary: 'Readiness: each dependency checked now', tag: 'operations', responses: { 200: Readiness, 503: Readiness } },
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
      doc: { summary: 'Prometheus metrics of this port (docs/metrics.md)', tag: 'operations', responses: { 200: { text: 'text/plain' } } },
      handler: async () => ({ raw: await registry.metrics(), contentType: registry.contentType }),
    },
  ];
}

const ServedDocument = z.record(z.string(), z.unknown()).describe('an OpenAPI 3.1 document');

/**
 * `GET /openapi.json`: the OpenAPI 3.1 document of what this address serves, generated from
 * its routes' declarations the first time it is asked for (every route is registered by then).
 */
export function openApiRoute(router: Router, family: ApiFamily, info: ApiInfo): Route {
  let text: string | undefined;
  return {
    method: 'GET',
    path: '/openapi.json',
    family,
    auth: 'public',
    doc: { summary: 'This address\'s OpenAPI 3.1 document', tag: 'operations', responses: { 200: ServedDocument } },
    handler: () => ({ raw: (text ??= JSON.stringify(openApiDocument(router.routes, info))) }),
  };
}
