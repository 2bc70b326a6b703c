import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot, startDaemon, stopDaemon } from './daemon.js';

// Daemons of their own: restart, signals, crash recovery, refusal to start.

async function post(base: string, key: string, p: string, body: unknown) {
  const r = await fetch(base + p, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

function runMain(env: Record<string, string>) {
  return spawnSync(process.execPath, [path.join(repoRoot, 'dist/src/main.js')], {
    env: { ...process.env, ...env },
    encoding: 'utf8',
    timeout: 20_000,
  });
}

describe('lifecycle', () => {
  it('keeps data across a clean restart, exits 0 on SIGTERM, and recovers after kill -9', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-life-'));
    const adminKey = 'lifecycle-admin-key-0123456789';
    const a = await startDaemon({ ADMIN_API_KEY: adminKey }, dir);
    const created = await post(a.platformUrl, adminKey, '/api/admin/users', { name: 'Kept', email: 'kept@test.io' });
    expect(created.status).toBe(201);
    expect(await stopDaemon(a, 'SIGTERM')).toBe(0);
    expect(fs.existsSync(path.join(dir, 'pg', 'postmaster.pid'))).toBe(false);

    const b = await startDaemon({ ADMIN_API_KEY: adminKey }, dir);
    const again = await post(b.platformUrl, adminKey, '/api/admin/users', { name: 'Kept', email: 'kept@test.io' });
    expect(again.status).toBe(409); // the user from the first run is still there
    b.proc.kill('SIGKILL');
    expect(await b.exited).toBe('SIGKILL'); // the harness names the signal that ended a daemon
    // The orphaned postgres still holds the data dir; the next start must clean it up.
    expect(fs.existsSync(path.join(dir, 'pg', 'postmaster.pid'))).toBe(true);

    const c = await startDaemon({ ADMIN_API_KEY: adminKey }, dir);
    const third = await post(c.platformUrl, adminKey, '/api/admin/users', { name: 'Kept', email: 'kept@test.io' });
    expect(third.status).toBe(409);
    const ready = await fetch(`${c.platformUrl}/readyz`);
    expect(ready.status).toBe(200);
    expect(await stopDaemon(c, 'SIGINT')).toBe(0);
    fs.rmSync(dir, { recursive: true, force: true });
  }, 120_000);

  it('shuts down cleanly when the process that started it dies of a signal (its IPC channel closes)', async () => {
    // A harness of its own: it starts a daemon as the tests do, says where, and is then killed.
    const harness = `import { startDaemon } from ${JSON.stringify(path.join(repoRoot, 'dist/test/daemon.js'))};
      const d = await startDaemon();
      console.log(JSON.stringify({ pid: d.pid, dataDir: d.dataDir }));
      setInterval(() => {}, 1000);`;
    const { spawn } = await import('node:child_process');
    const h = spawn(process.execPath, ['--input-type=module', '-e', harness], { stdio: ['ignore', 'pipe', 'inherit'] });
    const started = await new Promise<{ pid: number; dataDir: string }>((resolve, reject) => {
      let out = '';
      h.stdout!.on('data', (b: Buffer) => {
        out += b.toString();
        if (out.includes('\n')) resolve(JSON.parse(out.split('\n')[0]!));
      });
      h.on('exit', (code) => reject(new Error(`harness exited with ${code} before its daemon listened`)));
    });
    const alive = () => {
      try {
        process.kill(started.pid, 0);
        return true;
      } catch {
        return false;
      }
    };
    expect(alive()).toBe(true);
    h.kill('SIGKILL');
    const deadline = Date.now() + 60_000;
    while (alive() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    expect(alive()).toBe(false);
    // A clean shutdown: the embedded PostgreSQL stopped too, and its pid file is gone.
    expect(fs.existsSync(path.join(started.dataDir, 'pg', 'postmaster.pid'))).toBe(false);
    expect(fs.readFileSync(fs.readdirSync(started.dataDir).filter((f) => f.startsWith('daemon-')).map((f) => path.join(started.dataDir, f))[0]!, 'utf8')).toContain('parent gone');
    fs.rmSync(started.dataDir, { recursive: true, force: true });
  }, 120_000);

  it('refuses a bad setting with exit code 2 naming the variable', () => {
    const r = runMain({ PORT: 'not-a-port' });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('PORT="not-a-port"');
  });

  it('refuses to start on the uWebSockets.js JavaScript fallback', () => {
    const r = runMain({ UWS_USE_FALLBACK: '1' });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('refusing to start');
  });
});
