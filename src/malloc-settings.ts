// glibc's malloc settings that `npm start` and both images run the daemon with (package.json,
// Dockerfile, Dockerfile.gpu; test/docker.test.ts holds them to these). A daemon started as plain
// `node dist/src/main.js` (a supervisor, a custom image) has neither unless its environment sets
// them, and loses what they give without a word: the start-up says so (main.ts).

/**
 * - MALLOC_ARENA_MAX=2: with glibc's default (up to 8 arenas a core) a mixed soak's resident
 *   memory grew 7.8-13.7 MiB/min in its second half (docs/faults.md "Memory");
 * - glibc.malloc.tcache_count=1024: onnxruntime mallocs and frees ~1,000 small blocks a model
 *   step, ~260 of one size, past the thread cache's default of 7 a size (bench/README.md
 *   "malloc's thread cache": one stream of m25 int4 +4.8 % on an Intel with AMX, +1.6-10 % on a Zen 5).
 */
export const MALLOC_AS_SHIPPED = { MALLOC_ARENA_MAX: '2', GLIBC_TUNABLES: 'glibc.malloc.tcache_count=1024' } as const;

/**
 * The shipped settings that `env` leaves out, as `NAME=value` to set: none where the C library is
 * not glibc (`glibc`: its version, undefined elsewhere), or where the operator set the variable
 * (another MALLOC_ARENA_MAX, or a GLIBC_TUNABLES with a tcache_count of its own, is a choice).
 */
export function mallocSettingsMissing(env: NodeJS.ProcessEnv, glibc: string | undefined): string[] {
  if (!glibc) return [];
  const missing: string[] = [];
  if (env.MALLOC_ARENA_MAX === undefined) missing.push(`MALLOC_ARENA_MAX=${MALLOC_AS_SHIPPED.MALLOC_ARENA_MAX}`);
  if (!(env.GLIBC_TUNABLES ?? '').split(':').some((t) => t.startsWith('glibc.malloc.tcache_count='))) missing.push(`GLIBC_TUNABLES=${MALLOC_AS_SHIPPED.GLIBC_TUNABLES}`);
  return missing;
}

/** This process's glibc version, or undefined where it runs on another C library (musl) or OS. Node's report is its one documented source; building it takes ~5 ms, once at start. */
export function glibcVersion(): string | undefined {
  if (process.platform !== 'linux') return undefined;
  const report = process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined;
  return report?.header?.glibcVersionRuntime;
}
