import path from 'node:path';
import { z } from 'zod';
import { parseCorsOrigins } from './http/cors.js';
import { MODEL_DTYPES } from './inference/convert/model-config.js';
import { WEBGPU_VALIDATION_MODES } from './inference/runtime/execution-provider.js';
import { THREAD_SPIN_SETTINGS, threadSpinOf } from './inference/runtime/spin.js';
import { MODEL_THREAD_SCHEDS } from './inference/runtime/thread-policy.js';
import { TOKENS_POST_INTERVAL_MS } from './inference/runtime/token-posts.js';
import { LOG_FORMATS } from './log.js';

// Every setting of the daemon, read from the environment once at start and
// validated here. A bad value stops the start with a message naming the
// variable and the rule (exit code 2). Each limit says its unit in its name
// and why it is that number. The README's configuration table mirrors this file.

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
const bool = z.enum(['true', 'false', '1', '0']).transform((v) => v === 'true' || v === '1');

const envSchema = z.object({
  // Platform API port (the spec's {base_url}); 0 picks a free port (tests).
  PORT: int(0, 65535).default(8000),
  // Inference API port (the spec's {inference_url}).
  INFERENCE_PORT: int(0, 65535).default(8001),
  // Loopback by default so a fresh `npm start` exposes nothing; Docker sets 0.0.0.0.
  HOST: z.string().min(1).default('127.0.0.1'),
  DATA_DIR: z.string().min(1).default('./data'),
  // When set, an external PostgreSQL is used and no embedded server starts.
  DATABASE_URL: z.string().url().optional(),
  // Bootstrap admin key: a principal with admin:* exists for it while it is set.
  ADMIN_API_KEY: z.string().min(16, 'must be at least 16 characters').optional(),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  // json (default), ecs (Elastic Common Schema) or pretty (a terminal): src/log.ts.
  LOG_FORMAT: z.enum(LOG_FORMATS).default('json'),
  // Test mode: every answer is checked against its route's declared schema (/openapi.json);
  // a mismatch is logged as an error and a success answer becomes a 500. Needs ajv (dev dependency).
  CHECK_RESPONSE_SCHEMAS: bool.default(false),
  MODELS_DIR: z.string().min(1).default('./models'),
  // Platform JSON bodies are small records; 1 MiB is generous and bounds memory per request.
  MAX_BODY_BYTES: int(1024, 1 << 30).default(1 << 20),
  // Evaluations carry up to 8 MiB of base64 images (11 MiB as text); the spec caps the body at 16 MiB.
  EVAL_BODY_BYTES_MAX: int(1024, 1 << 30).default(16 << 20),
  // Real clients push evaluation samples in batches of up to 25 MiB; 32 MiB leaves room for the envelope.
  SAMPLES_BODY_BYTES_MAX: int(1024, 1 << 30).default(32 << 20),
  // Chat requests: long conversations, but text only; 4 MiB covers any context we serve.
  CHAT_BODY_BYTES_MAX: int(1024, 1 << 30).default(4 << 20),
  // Non-streaming requests must answer within this; a stuck DB call must not hold a socket forever.
  REQUEST_TIMEOUT_MS: int(100, 3_600_000).default(30_000),
  // A request is admitted to a model only if it would start within this (estimated from the
  // work queued and the measured rate); others get 429 with Retry-After. See options.ts.
  ADMISSION_WAIT_MS_MAX: int(100, 600_000).default(10_000),
  // Memory per evaluation model for states kept after their questions ran, so the same user's
  // next request on the same state does not prefill it again; 0 keeps none. See options.ts.
  EVAL_PREFIX_CACHE_MB: int(0, 1_048_576).default(256),
  // Memory per chat model for finished generations kept so that the same user's next prompt
  // opening with the same tokens runs only the rest; 0 keeps none. See options.ts.
  CHAT_PREFIX_CACHE_MB: int(0, 1_048_576).default(256),
  // A body must arrive within this from the request's start (408 and the connection closed
  // after): a client trickling a body must not hold a stream route's 10-minute deadline.
  BODY_TIMEOUT_MS: int(100, 3_600_000).default(30_000),
  // Requests one client address may have in flight (429 past it); 0: no cap. Off by default:
  // behind a load balancer every request comes from its address. Set it where clients connect directly.
  CLIENT_INFLIGHT_MAX: int(0, 1_000_000).default(0),
  // A stream may run longer (max_tokens at a slow rate), but not forever.
  STREAM_TIMEOUT_MS: int(1000, 3_600_000).default(600_000),
  // On SIGTERM, in-flight requests get this long to finish before we close anyway.
  // 4 s keeps the whole stop inside Docker's default 10 s (docker stop, then SIGKILL):
  // 4 s drain + at most 2.5 s of final charge flush + 1 s database close + 2 s
  // embedded PostgreSQL stop = 9.5 s. With a longer budget (--stop-timeout,
  // terminationGracePeriodSeconds) raise it to that budget minus 6 s.
  SHUTDOWN_GRACE_MS: int(0, 600_000).default(4_000),
  // Two cores on the reference machine; 10 connections keep PostgreSQL busy without thrashing.
  DB_POOL_MAX: int(1, 200).default(10),
  // Auth results are cached this long, so a hot route does no DB round trip per request.
  AUTH_CACHE_TTL_MS: int(0, 3_600_000).default(10_000),
  // Billing meter period (DESIGN.md default 10 s).
  METER_INTERVAL_MS: int(100, 3_600_000).default(10_000),
  // Simulated provider: offer minutes are scaled by this (1/60: a 3-minute offer is ready in 3 s).
  PROVIDER_TIME_SCALE: z.coerce.number().min(0).max(1000).default(0.0167),
  // Inference engine.
  EXECUTION_PROVIDER: z.enum(['cpu', 'webgpu', 'cuda']).default('cpu'),
  EXECUTION_PROVIDER_STRICT: bool.default(false),
  // onnxruntime's webgpu `validationMode`: how much Dawn checks each dispatch from the host. A
  // decode step is a few hundred dispatches and one stream is bound by issuing them, but on an
  // H200 no mode moved a step beyond a run's noise (bench/README.md "GPU on an H200 with this
  // build"). Unset: onnxruntime's own default (`basic`).
  WEBGPU_VALIDATION_MODE: z.enum(WEBGPU_VALIDATION_MODES).optional(),
  // The weight variant every model folder that holds it serves (model_q4.onnx for q4, ...), over its
  // cloudgate.json `dtype`; a folder without that file serves its own choice (models/README.md).
  MODEL_DTYPE: z.enum(MODEL_DTYPES).optional(),
  // Intra-op threads of every model's session. Unset: each model picks (runtime/engine.ts
  // threadsFor): every core, but one thread for a model whose weights are so small that waking
  // a second thread per operator costs more than it saves (bench/README.md "Every core").
  ORT_INTRA_OP_THREADS: int(1, 256).optional(),
  // Niceness of each model's ONNX threads, and of its worker thread where the workers could fill
  // the cores (Linux: per thread; the HTTP thread stays at the process's; runtime/thread-policy.ts
  // workerThreadNice): with every core given to the models, the HTTP thread still runs first
  // when a request arrives. 10: the scheduler weighs a nice-0 thread about ten times a nice-10
  // one. 0 turns it off (bench/README.md "Every core", "The worker's own thread").
  MODEL_THREADS_NICE: int(0, 19).default(10),
  // Scheduling policy of the same threads (Linux): `normal` (default) keeps the default policy at
  // the niceness above; `idle` (SCHED_IDLE) runs them only when no other thread wants a core, so
  // a request never waits for a model's time slice. Idle threads spinning while a step runs
  // (with ORT_INTRA_OP_SPIN=run) brought the gateway's added p99 while 16 streams of m25 int4
  // generate to 1.0 ms from 1.87 (medians of 8 alternated runs) and 16 streams +13 %, but one
  // stream lost 5-22 %: the kernel counts a core running only idle threads as free and puts the
  // HTTP thread and the client there at every token (bench/README.md "Model threads that give way").
  MODEL_THREADS_SCHED: z.enum(MODEL_THREAD_SCHEDS).default('normal'),
  // How the intra-op threads of a model on several threads wait between operators (runtime/spin.ts).
  // `off` (default): they sleep, and each operator wakes them. `run`: they spin while a step runs
  // and sleep as soon as it returns: m25 int4 ~8 % more tokens/s at 1 and 16 streams, m110 int4
  // +23 % at one (a 20-token prompt 6.3 ms against 8.1), but at the normal scheduling policy the
  // HTTP thread then waits for a core during steps: the gateway's added p99 while 16 streams
  // generate rose from 1.6 to 2.4 ms (under MODEL_THREADS_SCHED=idle it fell, see there).
  // `always` (onnxruntime's default) spins between steps too: 16 streams of stories260K fell from
  // 8,400-9,100 to 5,900-6,500 tokens/s (bench/README.md "Spinning while a step runs").
  // true / false: always / off.
  ORT_INTRA_OP_SPIN: z.enum(THREAD_SPIN_SETTINGS).default('off').transform(threadSpinOf),
  // A model on several intra-op threads whose weights are at most 256 MiB also loads a
  // one-thread session of the same graph, and each step of at most 32 tokens runs on whichever
  // of the two has been faster for steps of its size: one stream of m25 int4 steps in 1.30 ms
  // on one thread and 2.03 ms on two (a wake-up per operator). The cost is a second copy of
  // the weights (runtime/session-choice.ts, bench/README.md "One thread for narrow steps").
  ORT_NARROW_SESSION: bool.default(true),
  // Such a model, when its threads sleep (ORT_INTRA_OP_SPIN=off), also loads a session whose
  // threads spin while a step runs, and for 1 ms after it so that a decode run's next step finds
  // them awake (runtime/spin.ts DECODE_SPIN_AFTER_STEP_US), and while it holds at most 4
  // sequences its steps may run there when that has been faster for their size: one stream of
  // m25 int4 steps in 1.06 ms there against 1.42 on one thread and 1.48 on two sleeping (a Zen
  // 4 machine). Beyond 4 sequences the sleeping session runs every step, so the HTTP thread
  // finds a core while 16 streams generate. The cost is a third copy of the weights
  // (runtime/session-choice.ts, bench/README.md "Spinning for a few streams"). With
  // ORT_PREFILL_SESSION it also spins the
  // prefill graph for steps of 8-32 tokens (a short prompt: one stream's time to first token of
  // m25 int4 7.7 -> 6.6 ms), one more copy of the int8 weights.
  ORT_SPINNING_SESSION: bool.default(true),
  // That spinning session runs a chat model's slot-cache graph rewritten for steps of one token a
  // row (a decode step; runtime/one-token-graph.ts): a token's own key and value without MatMuls,
  // no softmax floor, the heads' Transposes as reshapes, 40 nodes fewer a step at m25. Its other
  // steps (a prompt's) then run on the other sessions. One stream of m25 int4's graph alone: a
  // step 0.92 of the time on two spinning threads (bench/README.md, fifty-first session). No more
  // memory: it is the spinning session's graph, not another session.
  ORT_ONE_TOKEN_GRAPH: bool.default(true),
  // A model of block-quantized weights (int8, q4, q4f16) of at most 256 MiB (1 GiB where its memory
  // fits, runtime/engine.ts PREFILL_SESSION_MEMORY_SHARE) also loads its graph
  // with those products as int8 ones (the weights rounded to int8 per column, the activations per
  // row: onnxruntime's integer product is the faster one from a few rows on), and a step of 8
  // tokens or more runs there when that has been faster for its size: one m25 matrix at 380 rows
  // took 553 us against 2,289 at 4 bits on an Intel machine with AMX. The cost is a copy of the
  // weights at one byte each and the long steps' buffers (runtime/prefill-graph.ts,
  // docs/faults.md "Memory", bench/README.md "Long steps in integers").
  ORT_PREFILL_SESSION: bool.default(true),
  // Such a model of at most 256 MiB also loads that graph with each layer's attention in four
  // pieces of the queries (each scores only the keys up to its own end), and a step whose longest
  // row adds 640 tokens or more runs there alone: a 1,000-token prompt's score tensors (heads x
  // tokens x tokens floats a layer) no longer spill the CPU's caches (its first token in 0.80 of
  // the time, m25 int4). One more copy of the int8 weights (runtime/long-steps.ts, bench/README.md
  // "Long prompts' attention in pieces").
  ORT_LONG_STEP_SESSION: bool.default(true),
  // A decode run's tokens are posted to the HTTP thread at most this often when its steps are
  // faster (a few steps a post; a sequence's first tokens and its end go at once): each post
  // wakes that thread, and its SSE write the client: 0.25 ms of CPU or more a post on a
  // 2-core VM. 0 posts every step (runtime/token-posts.ts, bench/README.md "Fewer token posts").
  TOKENS_POST_INTERVAL_MS: int(0, 1_000).default(TOKENS_POST_INTERVAL_MS),
  // A chat model's sequences are kept in up to four KV caches by length, and a step runs each
  // cache's rows as its own run of the graph (on the CPU): every row of a cache reads its longest
  // sequence's length, so 15 short rows beside one of 900 positions stepped 2.9x slower (m25
  // int4). `false` keeps them in one (runtime/kv-pools.ts, bench/README.md "Long rows apart").
  KV_SPLIT_LONG_ROWS: bool.default(true),
  // On a GPU provider (webgpu), a chat model's KV cache stays on the device between steps: fed
  // from the host, every step copied every row's whole cache up (runtime/kv-resident.ts). `false`
  // keeps it in host memory as on the CPU (for comparison).
  KV_ON_DEVICE: bool.default(true),
  // Workers per chat model on the CPU, each with its own sequences, the model's requests spread
  // over them (data parallel, as vLLM's --data-parallel-size): a small model's step is too many
  // tiny operators to split over the cores well, and two one-thread steps at once beat one on two
  // threads (m25 int4, 16 streams: MODEL_REPLICAS=2 1.14x, m110 even; bench/README.md "Replicas"). A
  // replica alone keeps every core (runtime/peers.ts). Each loads the model's sessions again:
  // its weights count this many times in memory. Evaluation models keep one (runtime/replicas.ts).
  MODEL_REPLICAS: int(1, 64).default(1),
  // Default rate limits per API key and model (0 = unlimited); per-key overrides are set on the key.
  // 600 requests and 1M tokens a minute: well above one interactive user, low enough that one
  // runaway client cannot take a 2-core engine from everybody else.
  RATE_LIMIT_RPM: int(0, 1_000_000_000).default(600),
  RATE_LIMIT_TPM: int(0, 1_000_000_000).default(1_000_000),
  // Browser origins allowed to call both APIs: comma-separated exact origins, or * (default none).
  CORS_ORIGINS: z
    .string()
    .default('')
    .transform((v, ctx) => {
      try {
        return parseCorsOrigins(v);
      } catch (e) {
        ctx.addIssue({ code: 'custom', message: (e as Error).message });
        return z.NEVER;
      }
    }),
  // Rate limits shared by every replica (src/inference/policy/redis-limiter.ts); unset: in process.
  REDIS_URL: z.string().regex(/^rediss?:\/\//, 'must be a redis:// or rediss:// URL').optional(),
  // An admission waits this long for Redis before this replica's own buckets decide (Redis answers in well under 1 ms).
  REDIS_TIMEOUT_MS: int(1, 10_000).default(50),
  // Prefix of every Redis key, so deployments (and tests) can share one Redis.
  REDIS_KEY_PREFIX: z.string().max(100).default('cloudgate:'),
  // Inference charges are posted to the ledger in batches this often (and at shutdown).
  CHARGE_FLUSH_INTERVAL_MS: int(50, 600_000).default(1_000),
});

export type Env = z.infer<typeof envSchema>;

export interface Config extends Env {
  dataDir: string;
  modelsDir: string;
}

export class ConfigError extends Error {}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  // Empty strings count as unset, as in most 12-factor tooling.
  const cleaned: Record<string, string> = {};
  for (const key of Object.keys(envSchema.shape)) {
    const v = env[key];
    if (v !== undefined && v !== '') cleaned[key] = v;
  }
  const parsed = envSchema.safeParse(cleaned);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => {
      const name = String(i.path[0]);
      return `${name}=${JSON.stringify(cleaned[name] ?? '')}: ${i.message}`;
    });
    throw new ConfigError(`invalid configuration:\n  ${lines.join('\n  ')}`);
  }
  return {
    ...parsed.data,
    dataDir: path.resolve(parsed.data.DATA_DIR),
    modelsDir: path.resolve(parsed.data.MODELS_DIR),
  };
}
