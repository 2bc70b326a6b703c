import type { Config } from './config.js';
import { connect, type Sql } from './db/index.js';
import { startEmbedded, type EmbeddedDb } from './db/embedded.js';
import { migrate } from './db/migrate.js';
import { livenessOf } from './db/bounded.js';
import { Authenticator } from './auth/authenticator.js';
import { bootstrapAdmin } from './auth/issuance.js';
import { issuanceRoutes } from './auth/routes.js';
import { Router, type Route } from './http/router.js';
import { HttpServer } from './http/server.js';
import { openApiRoute, opsRoutes, VERSION, type ReadyCheck } from './ops/routes.js';
import { ResponseCheck } from './http/response-check.js';
import { enableDefaultMetrics } from './metrics.js';
import { log } from './log.js';
import { ApiError } from './errors.js';

const PLATFORM_API_DESCRIPTION =
  'GPU pods, offers, network disks, teams, wallets and billing, evaluation records and admin operations. Errors answer {errors: [{param, details}]}, details naming the field, the rule and the value given.';
const INFERENCE_API_DESCRIPTION =
  'OpenAI-compatible chat and text completions (under /v1 and /api/v1), typed evaluations and the AI SDK gateway path /v4/ai/evaluation-model. Errors answer OpenAI\'s {error: {message, type, code, param}}.';

/** What the route families get: configuration, the database, and lifecycle hooks. */
export interface Services {
  config: Config;
  sql: Sql;
  auth: Authenticator;
  /** Readiness checks shown by /readyz. */
  ready: ReadyCheck[];
  /** Run on shutdown after the servers drained, in reverse order of registration. */
  onShutdown(fn: () => Promise<void> | void): void;
}

export interface Daemon {
  platformPort: number;
  inferencePort: number;
  services: Services;
  shutdown(): Promise<void>;
}

/** Seconds queries still running at stop get before their connections close. */
const DB_CLOSE_WAIT_S = 1;
/** After the grace, how long requests told of the shutdown get to write that (an error frame). */
const SHUTDOWN_ABORT_WAIT_MS = 250;
/** How long a stop waits for the embedded PostgreSQL to shut down cleanly. */
const EMBEDDED_STOP_WAIT_MS = 2_000;

/** A route family: given the services, returns routes for either address. */
export interface Module {
  name: string;
  init(s: Services): Promise<{ platform?: Route[]; inference?: Route[] }>;
}

/** Start-up: config -> database -> migrations -> modules -> HTTP. */
export async function startDaemon(config: Config, modules: Module[]): Promise<Daemon> {
  enableDefaultMetrics();
  let embedded: EmbeddedDb | undefined;
  let url = config.DATABASE_URL;
  if (!url) {
    embedded = await startEmbedded(config.dataDir);
    url = embedded.url;
  }
  const sql = connect(url, config.DB_POOL_MAX);
  const hooks: Array<() => Promise<void> | void> = [];
  let shuttingDown = false;
  try {
    await migrate(sql);
    await bootstrapAdmin(sql, config.ADMIN_API_KEY);
  } catch (e) {
    await sql.end({ timeout: 1 });
    await embedded?.stop();
    throw e;
  }
  const services: Services = {
    config,
    sql,
    auth: new Authenticator(sql, config.AUTH_CACHE_TTL_MS),
    // From the pool's liveness probe (src/db/bounded.ts): /readyz answers at once, and
    // 503 within ~1.5 s of the database going silent.
    ready: [
      {
        name: 'database',
        check: async () => {
          const live = livenessOf(sql);
          if (live && !live.alive()) throw new Error(`the database has not answered for ${Math.round(live.silentMs())} ms`);
        },
      },
    ],
    onShutdown: (fn) => hooks.push(fn),
  };

  // Key changes made by any replica drop every replica's key cache (revocation within milliseconds).
  services.onShutdown(await services.auth.listen());

  const platform = new Router();
  const inference = new Router();
  // Each port serves its own metrics registry (src/metrics.ts): no series on both.
  const failure = () => embedded?.failure();
  platform.addAll(opsRoutes(services.ready, () => shuttingDown, 'platform', failure));
  inference.addAll(opsRoutes(services.ready, () => shuttingDown, 'inference', failure).map((r) => ({ ...r, family: 'inference' as const })));
  platform.addAll(issuanceRoutes(sql, services.auth));
  for (const m of modules) {
    const r = await m.init(services);
    if (r.platform) platform.addAll(r.platform);
    if (r.inference) inference.addAll(r.inference);
  }

  // Last, so each document lists every route of its address (itself included).
  platform.add(openApiRoute(platform, 'platform', { title: 'cloudgate platform API', version: VERSION, description: PLATFORM_API_DESCRIPTION }));
  inference.add(openApiRoute(inference, 'inference', { title: 'cloudgate inference API', version: VERSION, description: INFERENCE_API_DESCRIPTION }));

  const common = {
    auth: services.auth,
    bodyBytesMax: config.MAX_BODY_BYTES,
    timeoutMs: config.REQUEST_TIMEOUT_MS,
    bodyTimeoutMs: config.BODY_TIMEOUT_MS,
    clientInflightMax: config.CLIENT_INFLIGHT_MAX,
    host: config.HOST,
    cors: config.CORS_ORIGINS,
    check: config.CHECK_RESPONSE_SCHEMAS ? await ResponseCheck.create() : undefined,
  };
  const servers = [
    new HttpServer({ ...common, name: 'platform', port: config.PORT, family: 'platform', router: platform }),
    new HttpServer({
      ...common,
      name: 'inference',
      port: config.INFERENCE_PORT,
      family: 'inference',
      router: inference,
      notFoundHint: '; the inference API is served under /v1 (as OpenAI-compatible servers do) and /api/v1, e.g. POST /v1/chat/completions, GET /v1/models',
    }),
  ];
  const [platformPort, inferencePort] = await Promise.all(servers.map((s) => s.listen()));
  log.info({ platformPort, inferencePort, host: config.HOST, database: embedded ? 'embedded' : 'external', checkResponseSchemas: config.CHECK_RESPONSE_SCHEMAS || undefined }, 'listening');

  let done: Promise<void> | undefined;
  const shutdown = () =>
    (done ??= (async () => {
      shuttingDown = true;
      embedded?.holdRestarts();
      for (const s of servers) s.stopAccepting();
      const drained = await Promise.all(servers.map((s) => s.drain(config.SHUTDOWN_GRACE_MS)));
      if (!drained.every(Boolean)) {
        log.warn('shutdown grace period ended with requests still in flight; they are told so');
        // Each gets a 503 or, mid-stream, an in-band error, instead of a cut connection.
        const err = new ApiError('unavailable', 'the server is shutting down; retry on another replica', { code: 'shutting_down', retryAfterMs: 1_000 });
        for (const s of servers) s.abortInflight(err);
        await Promise.all(servers.map((s) => s.drain(SHUTDOWN_ABORT_WAIT_MS)));
      }
      for (const s of servers) s.close();
      let failed = 0;
      for (const fn of hooks.reverse()) {
        try {
          await fn();
        } catch (e) {
          failed++;
          log.error({ err: e }, 'shutdown hook failed');
        }
      }
      await sql.end({ timeout: DB_CLOSE_WAIT_S });
      // An embedded server that already died must not hold the exit past the orchestrator's budget.
      if (embedded) await Promise.race([embedded.stop(), new Promise<void>((r) => setTimeout(r, EMBEDDED_STOP_WAIT_MS).unref())]);
      // A hook that failed may have lost something (charges that could not be journaled): exit non-zero.
      if (failed) throw new Error(`${failed} shutdown hook(s) failed`);
      log.info('stopped');
    })());

  return { platformPort: platformPort!, inferencePort: inferencePort!, services, shutdown };
}
