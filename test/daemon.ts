import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { randomBytes } from 'node:crypto';

// Starts the real daemon (compiled dist/) on ephemeral ports with a temporary
// DATA_DIR, as an operator would, and waits for its "listening" line.

export interface DaemonInfo {
  platformUrl: string;
  inferenceUrl: string;
  adminKey: string;
  dataDir: string;
  pid: number;
}

export const repoRoot = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');

export interface Started extends DaemonInfo {
  proc: ChildProcess;
  logFile: string;
  exited: Promise<number | null>;
}

export async function startDaemon(env: Record<string, string> = {}, dataDir?: string): Promise<Started> {
  const dir = dataDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-test-'));
  const adminKey = env.ADMIN_API_KEY ?? `admin-${randomBytes(16).toString('hex')}`;
  const logFile = path.join(dir, `daemon-${Date.now()}.log`);
  const out = fs.openSync(logFile, 'a');
  const proc = spawn(process.execPath, [path.join(repoRoot, 'dist/src/main.js')], {
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
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = new Promise<number | null>((r) => proc.on('exit', (code) => r(code)));
  proc.stderr!.on('data', (d) => fs.appendFileSync(logFile, d));
  const rl = readline.createInterface({ input: proc.stdout! });
  const ports = await new Promise<{ platformPort: number; inferencePort: number }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`daemon did not start within 60 s; log: ${logFile}`)), 60_000);
    rl.on('line', (line) => {
      fs.appendFileSync(logFile, line + '\n');
      if (line.includes('"listening"')) {
        clearTimeout(timer);
        resolve(JSON.parse(line));
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`daemon exited with ${code} before listening; log:\n${fs.readFileSync(logFile, 'utf8').slice(-3000)}`));
    });
  });
  fs.closeSync(out);
  return {
    platformUrl: `http://127.0.0.1:${ports.platformPort}`,
    inferenceUrl: `http://127.0.0.1:${ports.inferencePort}`,
    adminKey,
    dataDir: dir,
    pid: proc.pid!,
    proc,
    logFile,
    exited,
  };
}

export async function stopDaemon(d: Started, signal: NodeJS.Signals = 'SIGTERM'): Promise<number | null> {
  if (d.proc.exitCode !== null) return d.proc.exitCode;
  d.proc.kill(signal);
  return d.exited;
}
