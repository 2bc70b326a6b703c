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
