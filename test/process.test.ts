import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot, startDaemon, stopDaemon } from './daemon.js';

// The process as an orchestrator runs it: `npm start` under a supervisor, and
// SIGTERM with a slow stream in flight inside Docker's default 10 s.

/** Docker's default `docker stop` wait before SIGKILL. */
const DOCKER_STOP_BUDGET_MS = 10_000;
/** SHUTDOWN_GRACE_MS's default. */
const GRACE_MS = 4_000;

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('process', () => {
  it('npm start: SIGTERM to npm stops the daemon (no orphan left running)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-npm-'));
    // --ignore-scripts skips prestart (the build): the suite built dist already.
    const npm = spawn('npm', ['start', '--ignore-scripts'], {
      cwd: repoRoot,
      env: { ...process.env, PORT: '0', INFERENCE_PORT: '0', HOST: '127.0.0.1', DATA_DIR: dir, ADMIN_API_KEY: 'admin-0123456789abcdef0123', LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    // 'close': npm has exited and its output pipes are read to the end.
    const closed = new Promise<void>((r) => npm.once('close', () => r()));
    let out = '';
    npm.stdout!.on('data', (d) => (out += d));
    npm.stderr!.on('data', () => undefined);
    const pid = await new Promise<number>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`daemon did not listen: ${out.slice(-2000)}`)), 60_000);
      npm.stdout!.on('data', () => {
        const line = out.split('\n').find((l) => l.includes('"msg":"listening"'));
        if (line) {
          clearTimeout(t);
          resolve(JSON.parse(line).pid as number);
        }
      });
    });
    expect(pid).not.toBe(npm.pid);
    npm.kill('SIGTERM');
    let gone = false;
    for (let i = 0; i < 100 && !gone; i++) {
      await new Promise((r) => setTimeout(r, 100));
      gone = !alive(pid);
    }
    if (!gone) process.kill(pid, 'SIGKILL');
    expect(gone).toBe(true);
    // The daemon's last lines may still be in the pipe when its pid is gone: read to npm's end.
    let t: NodeJS.Timeout | undefined;
    const ended = await Promise.race([closed.then(() => true), new Promise<boolean>((r) => (t = setTimeout(() => r(false), DOCKER_STOP_BUDGET_MS)))]);
    clearTimeout(t);
    expect(ended).toBe(true);
    expect(out).toContain('"msg":"stopped"');
    // npm start sets glibc's malloc settings itself, so its daemon does not ask for them.
    expect(out).not.toContain("started without npm start's malloc settings");
    fs.rmSync(dir, { recursive: true, force: true });
  }, 90_000);

  it("plain node without npm start's malloc settings: the daemon names the ones to set", async () => {
    // undefined leaves a variable out of the child's environment (child_process's rule).
    const d = await startDaemon({ MALLOC_ARENA_MAX: undefined, GLIBC_TUNABLES: undefined } as unknown as Record<string, string>);
    try {
      const lines = fs.readFileSync(d.logFile, 'utf8').split('\n').flatMap((l) => {
        try {
          return [JSON.parse(l) as { level?: string; missing?: string[] }];
        } catch {
          return [];
        }
      });
      expect(lines.find((l) => l.level === 'warn' && l.missing)?.missing).toEqual(['MALLOC_ARENA_MAX=2', 'GLIBC_TUNABLES=glibc.malloc.tcache_count=1024']);
    } finally {
      await stopDaemon(d);
    }
  }, 60_000);

  it('SIGTERM while it starts (PostgreSQL up, models not yet loaded) waits for the start, then shuts down cleanly', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-early-'));
    const proc = spawn(process.execPath, [path.join(repoRoot, 'dist/src/main.js')], {
      cwd: repoRoot,
      env: { ...process.env, PORT: '0', INFERENCE_PORT: '0', HOST: '127.0.0.1', DATA_DIR: dir, ADMIN_API_KEY: 'admin-0123456789abcdef0123', LOG_LEVEL: 'info', DATABASE_URL: '' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const closed = new Promise<number | null>((r) => proc.once('close', (code) => r(code)));
    let out = '';
    let sent = false;
    proc.stdout!.on('data', (d) => {
      out += d;
      // Before "listening": the signal used to take the default action and leave PostgreSQL running.
      if (!sent && out.includes('"msg":"embedded postgres ready"')) {
        sent = true;
        proc.kill('SIGTERM');
      }
    });
    proc.stderr!.on('data', () => undefined);
    let t: NodeJS.Timeout | undefined;
    const code = await Promise.race([closed, new Promise<'timeout'>((r) => (t = setTimeout(() => r('timeout'), 60_000)))]);
    clearTimeout(t);
    if (code === 'timeout') proc.kill('SIGKILL');
    expect(sent).toBe(true);
    expect(code).toBe(0);
    expect(out).toContain('"starting":true');
    expect(out).toContain('"msg":"stopped"');
    // The embedded server was stopped too: its lock file is gone with it.
    expect(fs.existsSync(path.join(dir, 'pg', 'postmaster.pid'))).toBe(false);
    fs.rmSync(dir, { recursive: true, force: true });
  }, 90_000);

  it('SIGTERM with a request in flight exits 0 within Docker\'s 10 s (grace 4 s, then the flush and the database stop)', async () => {
    const d = await startDaemon({ CHARGE_FLUSH_INTERVAL_MS: '600000' });
    const h = { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' };
    const u = (await (await fetch(`${d.platformUrl}/api/admin/users`, { method: 'POST', headers: h, body: JSON.stringify({ name: 'stop', email: `stop-${Date.now()}@test.local` }) })).json()) as any;
    const k = (await (await fetch(`${d.platformUrl}/api/admin/api-keys`, { method: 'POST', headers: h, body: JSON.stringify({ userId: u.data.id, permissions: ['inference:use'] }) })).json()) as any;
    await fetch(`${d.platformUrl}/api/admin/transactions/topup`, { method: 'POST', headers: h, body: JSON.stringify({ userId: u.data.id, amount: 1_000_000, type: 'TOPUP', description: 'test' }) });
    const key = k.data.key as string;
    const chat = (extra: object) => JSON.stringify({ model: 'cloudgate/random-llama-chat', messages: [{ role: 'user', content: 'hi' }], max_tokens: 8, temperature: 0, ...extra });
    // Finished requests whose charges only the shutdown posts (the flush interval is 10 minutes).
    for (let i = 0; i < 3; i++) {
      const r = await fetch(`${d.inferenceUrl}/api/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: chat({}) });
      expect(r.status).toBe(200);
      await r.arrayBuffer();
    }
    // A request still in flight at SIGTERM: its body is declared and never finished, so it
    // holds the drain for the whole grace (the slowest case a stream can be too).
    const url = new URL(`${d.inferenceUrl}/api/v1/chat/completions`);
    const held = http.request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': 1000 } });
    held.on('error', () => undefined);
    held.write('{"model":');
    await new Promise((r) => setTimeout(r, 200));
    const t0 = performance.now();
    const code = await stopDaemon(d);
    const ms = performance.now() - t0;
    held.destroy();
    expect(code).toBe(0);
    expect(ms).toBeGreaterThanOrEqual(GRACE_MS - 100); // the in-flight request had its grace
    expect(ms).toBeLessThan(DOCKER_STOP_BUDGET_MS - 500);
    const log = fs.readFileSync(d.logFile, 'utf8');
    expect(log).toContain('"msg":"stopped"');
    console.log(`SIGTERM to exit with a request in flight: ${Math.round(ms)} ms (budget ${DOCKER_STOP_BUDGET_MS} ms)`);
    fs.rmSync(d.dataDir, { recursive: true, force: true });
  }, 60_000);
});
