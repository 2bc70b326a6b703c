import type { Module } from '../app.js';
import { log } from '../log.js';
import { Engine } from './runtime/engine.js';
import path from 'node:path';
import { ChargeJournal } from './policy/charge-journal.js';
import { Charger, postJournalEntries } from './policy/charger.js';
import { RateLimiter, type Limiter } from './policy/limiter.js';
import { RedisRateLimiter } from './policy/redis-limiter.js';
import { GatewayPolicies } from './policy/policies.js';
import { inferenceRoutes } from './routes.js';

/** How long start-up waits for the Redis connection before serving on in-process limits. */
const REDIS_CONNECT_WAIT_MS = 2_000;

/** The inference face: models from MODELS_DIR on the engine, behind the gateway policies. */
export const inferenceModule: Module = {
  name: 'inference',
  async init(s) {
    const c = s.config;
    const engine = await Engine.load({
      modelsDir: c.modelsDir,
      executionProvider: c.EXECUTION_PROVIDER,
      strict: c.EXECUTION_PROVIDER_STRICT,
      webgpuValidationMode: c.WEBGPU_VALIDATION_MODE,
      intraOpThreads: c.ORT_INTRA_OP_THREADS,
      threadsNice: c.MODEL_THREADS_NICE,
      threadsSched: c.MODEL_THREADS_SCHED,
      threadsSpin: c.ORT_INTRA_OP_SPIN,
      narrowSession: c.ORT_NARROW_SESSION,
      spinningSession: c.ORT_SPINNING_SESSION,
      oneTokenGraph: c.ORT_ONE_TOKEN_GRAPH,
      prefillSession: c.ORT_PREFILL_SESSION,
      longSession: c.ORT_LONG_STEP_SESSION,
      tokensPostIntervalMs: c.TOKENS_POST_INTERVAL_MS,
      kvSplit: c.KV_SPLIT_LONG_ROWS,
      kvOnDevice: c.KV_ON_DEVICE,
      replicas: c.MODEL_REPLICAS,
      options: { admissionWaitMsMax: c.ADMISSION_WAIT_MS_MAX, prefixCacheBytesMax: c.EVAL_PREFIX_CACHE_MB * 2 ** 20, chatPrefixCacheBytesMax: c.CHAT_PREFIX_CACHE_MB * 2 ** 20 },
      dtype: c.MODEL_DTYPE,
    });
    log.info({ models: engine.list().map((m) => `${m.id} (${m.kind})`), provider: c.EXECUTION_PROVIDER }, 'models loaded');
    let policies: GatewayPolicies | undefined;
    // Usage a previous run journaled but did not post is posted here, before serving.
    const journal = await ChargeJournal.open(s.sql, path.join(c.dataDir, 'journal'), postJournalEntries);
    const charger = new Charger(s.sql, c.CHARGE_FLUSH_INTERVAL_MS, journal, (walletId, units) => policies?.posted(walletId, units));
    let limiter: Limiter = new RateLimiter();
    if (c.REDIS_URL) {
      const shared = new RedisRateLimiter({ url: c.REDIS_URL, prefix: c.REDIS_KEY_PREFIX, timeoutMs: c.REDIS_TIMEOUT_MS }, limiter as RateLimiter);
      // Start-up waits a little for the connection; without it the replica starts on in-process limits and moves over when Redis answers.
      const connected = await shared.ready(REDIS_CONNECT_WAIT_MS);
      log.info({ connected }, 'rate limits kept in Redis');
      s.onShutdown(() => shared.close());
      limiter = shared;
    }
    policies = new GatewayPolicies(s.sql, limiter, charger, { requestsPerMinute: c.RATE_LIMIT_RPM, tokensPerMinute: c.RATE_LIMIT_TPM });
    charger.start();
    s.ready.push({
      name: 'models',
      check: async () => {
        if (engine.list().length === 0) throw new Error(`no models in ${c.modelsDir}`);
      },
    });
    // Reverse order at shutdown: the engine stops first, then the last charges are posted.
    s.onShutdown(async () => {
      await charger.stop();
    });
    s.onShutdown(() => engine.close());
    return {
      inference: inferenceRoutes(engine, policies, {
        chatBodyBytesMax: c.CHAT_BODY_BYTES_MAX,
        evalBodyBytesMax: c.EVAL_BODY_BYTES_MAX,
        streamTimeoutMs: c.STREAM_TIMEOUT_MS,
      }),
    };
  },
};
