import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { MALLOC_AS_SHIPPED } from '../src/malloc-settings.js';

// Starts the real daemon (compiled dist/) on ephemeral ports with a temporary
// DATA_DIR, as an operator would, and waits for its "listening" line.

export interface DaemonInfo {
  platformUrl: string;
  inferenceUrl: string;
  adminKey: string;
  dataDir: string;
  pid: number;
  logFile: string;
}

// This file runs from test/ (vitest) and from dist/test/ (benchmarks): find the repo by its package.json.
function findRoot(): string {
  let d = path.dirname(new URL(import.meta.url).pathname);
  while (!fs.existsSync(path.join(d, 'package.json'))) d = path.dirname(d);
  return d;
}
export const repoRoot = findRoot();

export interface Started extends DaemonInfo {
  proc: ChildProcess;
  /** The exit code, or the signal's name when a signal ended the process (a crash names itself). */
  exited: Promise<number | NodeJS.Signals>;
}

/** The daemon's process as spawned, before it listens. */
export interface Spawned extends Omit<Started, 'platformUrl' | 'inferenceUrl'> {
  /** What `exited` resolved with, once it has. */
  exitCode(): number | NodeJS.Signals | undefined;
}

/**
 * glibc's malloc settings of `npm start` and the images (src/malloc-settings.ts), which the test
 * daemons and benchmarks run with too. A GLIBC_TUNABLES of the environment's own goes after these
 * (glibc takes a tunable's last value), MALLOC_ARENA_MAX in place of this one.
 */
export { MALLOC_AS_SHIPPED };

/**
 * The node flags a daemon is started with: DAEMON_NODE_ARGS, flags that NODE_OPTIONS refuses
 * (--cpu-prof, V8's GC flags; for benchmarks), from the daemon's `env` (one side of ab.js) or else
 * from `outer`, this process's environment; separated by spaces.
 */
export function daemonNodeArgs(env: Record<string, string>, outer: NodeJS.ProcessEnv = process.env): string[] {
  return (env.DAEMON_NODE_ARGS ?? outer.DAEMON_NODE_ARGS ?? '').split(' ').filter(Boolean);
}

/** Spawns the daemon as startDaemon does, without waiting for anything (a test of its start-up). */
export function spawnDaemon(env: Record<string, string> = {}, dataDir?: string): Spawned {
  const dir = dataDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-test-'));
  const adminKey = env.ADMIN_API_KEY ?? `admin-${randomBytes(16).toString('hex')}`;
  const logFile = path.join(dir, `daemon-${Date.now()}.log`);
  // The daemon writes its log straight to a file (no pipe for this process to drain under load);
  // we poll the file for the "listening" line.
  const out = fs.openSync(logFile, 'a');
  const proc = spawn(process.execPath, [...daemonNodeArgs(env), path.join(repoRoot, 'dist/src/main.js')], {
    cwd: repoRoot,
    env: {
      ...process.env,
      PORT: '0',
      INFERENCE_PORT: '0',
      HOST: '127.0.0.1',
      DATA_DIR: dir,
      ADMIN_API_KEY: adminKey,
      LOG_LEVEL: 'info',
      PROVIDER_TIME_SCALE: '0.002',
      METER_INTERVAL_MS: '250',
      // As npm start and the image run it (package.json, Dockerfile; docker.test.ts holds them to these).
      MALLOC_ARENA_MAX: process.env.MALLOC_ARENA_MAX ?? MALLOC_AS_SHIPPED.MALLOC_ARENA_MAX,
      GLIBC_TUNABLES: [MALLOC_AS_SHIPPED.GLIBC_TUNABLES, process.env.GLIBC_TUNABLES].filter(Boolean).join(':'),
      // Under vitest every answer is checked against /openapi.json's declaration of its route;
      // stopDaemon fails on any mismatch. Benchmarks (not vitest) run without the check.
      CHECK_RESPONSE_SCHEMAS: process.env.VITEST ? '1' : '0',
      ...env,
    },
    // The IPC channel only tells the daemon when this process is gone, however it ended (main.ts).
    stdio: ['ignore', out, out, 'ipc'],
  });
  proc.channel?.unref();
  fs.closeSync(out);
  let exitCode: number | NodeJS.Signals | undefined;
  const exited = new Promise<number | NodeJS.Signals>((r) => proc.on('exit', (code, signal) => r((exitCode = code ?? signal!))));
  return { adminKey, dataDir: dir, pid: proc.pid!, proc, logFile, exited, exitCode: () => exitCode };
}

export async function startDaemon(env: Record<string, string> = {}, dataDir?: string): Promise<Started> {
  const { exitCode, ...spawned } = spawnDaemon(env, dataDir);
  const { proc, logFile } = spawned;
  const ports = await new Promise<{ platformPort: number; inferencePort: number }>((resolve, reject) => {
    const fail = (e: Error) => {
      proc.kill('SIGTERM');
      reject(e);
    };
    const deadline = Date.now() + 60_000;
    const poll = () => {
      const text = fs.readFileSync(logFile, 'utf8');
      const line = text.split('\n').find((l) => l.includes('"msg":"listening"'));
      if (line) return resolve(JSON.parse(line));
      if (exitCode() !== undefined) return reject(new Error(`daemon exited with ${exitCode()} before listening; log:\n${text.slice(-3000)}`));
      if (Date.now() > deadline) return fail(new Error(`daemon did not start within 60 s; log: ${logFile}`));
      setTimeout(poll, 50);
    };
    poll();
  });
  return { ...spawned, platformUrl: `http://127.0.0.1:${ports.platformPort}`, inferenceUrl: `http://127.0.0.1:${ports.inferencePort}` };
}

/** The embedded PostgreSQL's postmaster and its backends (to stop or kill them as a fault would). */
export function embeddedPostgresPids(dataDir: string): number[] {
  const master = Number(fs.readFileSync(path.join(dataDir, 'pg', 'postmaster.pid'), 'utf8').split('\n')[0]);
  const parentOf = (p: string) => {
    try {
      return Number(fs.readFileSync(`/proc/${p}/stat`, 'utf8').split(') ')[1]!.split(' ')[1]);
    } catch {
      return -1;
    }
  };
  const kids = fs
    .readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p) && parentOf(p) === master)
    .map(Number);
  return [master, ...kids];
}

/** A user with an API key holding `permissions`, its wallet funded with `funds` units, through the admin API. */
export async function fundedKey(d: DaemonInfo, funds: number, permissions = ['inference:use'], rateLimits?: Record<string, number>): Promise<{ userId: string; key: string }> {
  const post = async (p: string, body: unknown) => {
    const r = await fetch(`${d.platformUrl}${p}`, { method: 'POST', headers: { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    if (r.status >= 300) throw new Error(`${p}: ${r.status} ${await r.text()}`);
    return ((await r.json()) as { data: { id: string; key: string } }).data;
  };
  const u = await post('/api/admin/users', { name: 'fault', email: `fault-${Date.now()}-${randomBytes(4).toString('hex')}@test.local` });
  const k = await post('/api/admin/api-keys', { userId: u.id, permissions, ...(rateLimits ? { rateLimits } : {}) });
  if (funds) await post('/api/admin/transactions/topup', { userId: u.id, amount: funds, type: 'TOPUP' });
  return { userId: u.id, key: k.key };
}

export async function stopDaemon(d: Started, signal: NodeJS.Signals = 'SIGTERM'): Promise<number | NodeJS.Signals> {
  if (d.proc.exitCode === null) d.proc.kill(signal);
  const code = await d.exited;
  assertResponsesMatchSchemas(d.logFile);
  return code;
}

/** Throws when the daemon logged an answer that broke its route's declared schema (CHECK_RESPONSE_SCHEMAS). */
export function assertResponsesMatchSchemas(logFile: string): void {
  const bad = fs
    .readFileSync(logFile, 'utf8')
    .split('\n')
    .filter((l) => l.includes('"msg":"response does not match its declared schema"'));
  if (bad.length) throw new Error(`${bad.length} answers did not match their declared schemas (/openapi.json):\n${bad.slice(0, 20).join('\n')}`);
}
