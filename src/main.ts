import { loadConfig, ConfigError } from './config.js';
import { startDaemon, type Daemon, type Module } from './app.js';
import { loadUws, NativeUwsMissing } from './http/uws.js';
import { log } from './log.js';
import { isConnectionError } from './db/bounded.js';
import { inferenceModule } from './inference/module.js';
import { platformModule } from './platform/module.js';
import { moneyModule } from './money/module.js';
import { endHeldThreads } from './threads-at-exit.js';
import { glibcVersion, mallocSettingsMissing } from './malloc-settings.js';

// The route families the daemon serves; each module owns its routes and background work.
const modules: Module[] = [moneyModule, inferenceModule, platformModule];

/**
 * How long an exit that skips the shutdown waits for the model workers to end themselves: a step
 * is milliseconds to a few hundred (a 512-token prompt's chunk), one call of a model's loading
 * about as long.
 */
const EXIT_NOW_WAIT_MS = 2_000;

/**
 * Exits with `code` and no shutdown, once the model workers have ended themselves at the end of
 * their onnxruntime call in flight (or EXIT_NOW_WAIT_MS passed): an exit that cuts one inside
 * such a call is SIGABRT, not `code` (threads-at-exit.ts). Models may still be loading.
 */
function exitNow(code: number): void {
  process.exitCode = code; // should the loop empty before the exit below
  void Promise.race([endHeldThreads(), new Promise((r) => setTimeout(r, EXIT_NOW_WAIT_MS))]).finally(() => process.exit(code));
}

async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig();
    loadUws();
  } catch (e) {
    if (e instanceof ConfigError || e instanceof NativeUwsMissing) {
      process.stderr.write(`cloudgate: ${e.message}\n`);
      process.exit(2);
    }
    throw e;
  }
  const missing = mallocSettingsMissing(process.env, glibcVersion());
  if (missing.length) log.warn({ missing }, `started without npm start's malloc settings; set ${missing.join(' ')} in the environment: without them the resident memory grows and model steps run slower (README "Memory")`);
  // The handlers come first: a signal while the daemon starts (an orchestrator stopping a pod that
  // is still loading, or one that reads "listening" and stops it at once) would otherwise take
  // the default action and kill the process with no shutdown, leaving an embedded PostgreSQL
  // server orphaned. Such a signal waits for the start, then shuts down.
  let daemon: Daemon | undefined;
  let signals = 0;
  const shutDown = (d: Daemon) =>
    d.shutdown().then(
      () => process.exit(0),
      (e) => {
        log.error({ err: e }, 'shutdown failed');
        process.exit(1);
      },
    );
  const stop = (signal: string) => {
    if (++signals === 2) {
      log.warn({ signal }, 'second signal: exiting now');
      return exitNow(1);
    }
    if (signals > 2) {
      log.warn({ signal }, 'another signal: exiting without waiting');
      process.exit(1);
    }
    log.info({ signal, starting: !daemon || undefined }, 'shutting down');
    if (daemon) void shutDown(daemon);
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  // Started by a Node parent over IPC (the test and benchmark harness, a supervisor written in
  // Node), the daemon ends with it, as at a signal: a benchmark that died of a signal left its
  // daemon running, holding memory and waking under the next benchmarks.
  if (process.channel) {
    process.channel.unref();
    process.on('disconnect', () => stop('parent gone'));
  }
  daemon = await startDaemon(config, modules);
  if (signals) void shutDown(daemon);
}

// postgres.js rejects promises nothing waits on when the server goes away mid-call (a
// connection's pending writes at a kill -9 of PostgreSQL): that must not take the daemon
// down with it. Any other unhandled rejection is a bug and still ends the process.
process.on('unhandledRejection', (e) => {
  if (isConnectionError(e)) {
    log.warn({ err: e }, 'a database call failed with nothing waiting on it (the server went away)');
    return;
  }
  log.fatal({ err: e }, 'unhandled rejection');
  exitNow(1);
});
// As node's own handling (the error logged, exit code 1), but after the model workers end themselves.
process.on('uncaughtException', (e) => {
  log.fatal({ err: e }, 'uncaught exception');
  exitNow(1);
});

main().catch((e) => {
  log.fatal({ err: e }, 'failed to start');
  exitNow(1);
});
