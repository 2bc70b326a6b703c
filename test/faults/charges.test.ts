import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startDaemon, stopDaemon, type Started } from '../daemon.js';

// Issue 12.2 / 12.3: inference charges survive a kill -9 and a stop with the database dead.
// Flushes are pushed out of reach (10 minutes), so every charge is still unposted at the fault:
// without the journal all of them were lost.

const CHAT = 'cloudgate/random-llama-chat';
// random-llama-chat's prices: 0.1 and 0.2 USD per million tokens, as micro-USD (charger.ts PRICE_SCALE).
const IN_MICRO = 100_000;
const OUT_MICRO = 200_000;
const NUM_PER_UNIT = 100_000_000;
const FUNDS = 100_000;
const NO_FLUSH = { CHARGE_FLUSH_INTERVAL_MS: '600000' };
// Each test starts two or three daemons (each with its embedded PostgreSQL) one after another.
const FAULT_TEST_MS = 120_000;

const started: Started[] = [];
afterEach(async () => {
  for (const d of started.splice(0)) if (d.proc.exitCode === null) await stopDaemon(d);
});

async function json(url: string, key: string, method = 'GET', body?: unknown) {
  const r = await fetch(url, { method, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: r.status, body: (await r.json()) as any };
}

/** A funded user, then `n` completions: returns the key and the exact cost numerator they owe. */
async function spend(d: Started, n: number) {
  const u = await json(`${d.platformUrl}/api/admin/users`, d.adminKey, 'POST', { name: 'fault', email: `f-${Date.now()}@test.local` });
  const k = await json(`${d.platformUrl}/api/admin/api-keys`, d.adminKey, 'POST', { userId: u.body.data.id, permissions: ['inference:use', 'billing:read'] });
  await json(`${d.platformUrl}/api/admin/transactions/topup`, d.adminKey, 'POST', { userId: u.body.data.id, amount: FUNDS, type: 'TOPUP' });
  let numer = 0;
  for (let i = 0; i < n; i++) {
    const r = await json(`${d.inferenceUrl}/v1/chat/completions`, k.body.data.key, 'POST', { model: CHAT, messages: [{ role: 'user', content: `story ${i}` }], max_tokens: 64, temperature: 0 });
    expect(r.status).toBe(200);
    numer += IN_MICRO * r.body.usage.prompt_tokens + OUT_MICRO * r.body.usage.completion_tokens;
  }
  return { key: k.body.data.key as string, numer };
}

async function charged(d: Started, key: string): Promise<number> {
  const w = await json(`${d.platformUrl}/api/v1/billing/wallet`, key);
  return FUNDS - Math.round(w.body.balance_usd * 10_000);
}

describe('charge journal', () => {
  it('loses no charge to a kill -9: the next start posts the journal, exactly once', async () => {
    const d = await startDaemon(NO_FLUSH);
    started.push(d);
    const { key, numer } = await spend(d, 20);
    expect(numer).toBeGreaterThan(2 * NUM_PER_UNIT);
    d.proc.kill('SIGKILL');
    await d.exited;
    const again = await startDaemon({ ...NO_FLUSH, ADMIN_API_KEY: d.adminKey }, d.dataDir);
    started.push(again);
    expect(await charged(again, key)).toBe(Math.round(numer / NUM_PER_UNIT));
    // A clean stop and another start post nothing twice.
    expect(await stopDaemon(again)).toBe(0);
    const third = await startDaemon({ ...NO_FLUSH, ADMIN_API_KEY: d.adminKey }, d.dataDir);
    started.push(third);
    expect(await charged(third, key)).toBe(Math.round(numer / NUM_PER_UNIT));
    expect(fs.readdirSync(path.join(d.dataDir, 'journal')).filter((f) => f.endsWith('.journal'))).toHaveLength(1);
  }, FAULT_TEST_MS);

  it('posts exactly the total when live flushes posted part of it before the kill -9', async () => {
    const env = { CHARGE_FLUSH_INTERVAL_MS: '100' };
    const d = await startDaemon(env);
    started.push(d);
    const first = await spend(d, 15);
    await new Promise((r) => setTimeout(r, 400)); // a flush posts the whole units, the journal's checkpoint carries the rest
    const mid = await charged(d, first.key);
    expect(mid).toBe(Math.floor(first.numer / NUM_PER_UNIT));
    d.proc.kill('SIGKILL');
    await d.exited;
    const again = await startDaemon({ ...env, ADMIN_API_KEY: d.adminKey }, d.dataDir);
    started.push(again);
    expect(await charged(again, first.key)).toBe(Math.round(first.numer / NUM_PER_UNIT));
  }, FAULT_TEST_MS);

  it('keeps the charges of a stop with the database dead, within the grace, and posts them at the next start', async () => {
    const d = await startDaemon({ ...NO_FLUSH, SHUTDOWN_GRACE_MS: '2000' });
    started.push(d);
    const { key, numer } = await spend(d, 20);
    const pgPid = Number(fs.readFileSync(path.join(d.dataDir, 'pg', 'postmaster.pid'), 'utf8').split('\n')[0]);
    process.kill(pgPid, 'SIGKILL');
    const t0 = Date.now();
    d.proc.kill('SIGTERM');
    const code = await d.exited;
    const ms = Date.now() - t0;
    console.info(`stop with the database dead: exit ${code} after ${ms} ms`);
    expect(code).toBe(0);
    expect(ms).toBeLessThan(10_000);
    const log = fs.readFileSync(d.logFile, 'utf8');
    expect(log).toContain('inference charges kept in the journal');
    const again = await startDaemon({ ...NO_FLUSH, ADMIN_API_KEY: d.adminKey }, d.dataDir);
    started.push(again);
    expect(await charged(again, key)).toBe(Math.round(numer / NUM_PER_UNIT));
  }, FAULT_TEST_MS);
});
