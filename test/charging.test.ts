import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { repoRoot, startDaemon, stopDaemon } from './daemon.js';

// Charging is checked on a daemon of its own, with models priced high enough
// that every token moves the ledger by whole units (USD x 10000), so the sum
// of charges can be compared with tokens x prices exactly.

const IN_PRICE = 1000; // USD per million input tokens: 10 units a token
const OUT_PRICE = 3000; // 30 units a token
const EVAL_IN_PRICE = 500; // 5 units a token

function pricedModels(): string {
  const src = path.join(repoRoot, 'models');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-priced-'));
  for (const [name, prices] of [
    ['random-llama', { inputPerMTok: IN_PRICE, outputPerMTok: OUT_PRICE }],
    ['random-llama-eval', { inputPerMTok: EVAL_IN_PRICE, outputPerMTok: 0 }],
  ] as const) {
    const to = path.join(dir, name);
    fs.mkdirSync(to);
    for (const f of fs.readdirSync(path.join(src, name))) {
      if (f === 'cloudgate.json') continue;
      fs.symlinkSync(path.join(src, name, f), path.join(to, f));
    }
    const cfg = JSON.parse(fs.readFileSync(path.join(src, name, 'cloudgate.json'), 'utf8'));
    fs.writeFileSync(path.join(to, 'cloudgate.json'), JSON.stringify({ ...cfg, prices }));
  }
  return dir;
}

async function metricSum(base: string, name: string, labels: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) && l.includes(labels))
    .reduce((s, l) => s + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
}

describe('inference charging', () => {
  it('charges tokens x prices for a mixed load, cancelled streams included, and loses nothing across SIGTERM', async () => {
    const modelsDir = pricedModels();
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-charge-'));
    // A long flush interval: the charges still pending at SIGTERM must be posted by the shutdown flush.
    const env = { MODELS_DIR: modelsDir, CHARGE_FLUSH_INTERVAL_MS: '600000' };
    const d = await startDaemon(env, dataDir);
    const h = { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' };
    const post = (p: string, b: unknown) => fetch(d.platformUrl + p, { method: 'POST', headers: h, body: JSON.stringify(b) }).then((r) => r.json() as Promise<any>);
    const u = await post('/api/admin/users', { name: 'payer', email: 'payer@test.io' });
    const k = await post('/api/admin/api-keys', { userId: u.data.id, permissions: ['inference:use', 'billing:read'] });
    const START = 100_000_000;
    await post('/api/admin/transactions/topup', { userId: u.data.id, amount: START, type: 'TOPUP', description: 'funds' });
    const openai = new OpenAI({ baseURL: `${d.inferenceUrl}/api/v1`, apiKey: k.data.key, maxRetries: 0 });
    const chat = 'cloudgate/random-llama-chat';
    let evalInput = 0;
    const work: Promise<unknown>[] = [];
    for (let i = 0; i < 6; i++) {
      work.push(openai.chat.completions.create({ model: chat, messages: [{ role: 'user', content: `story ${i}` }], max_tokens: 5 + i, temperature: 0 }));
      work.push(
        fetch(`${d.inferenceUrl}/api/v1/evaluations`, {
          method: 'POST',
          headers: { authorization: `Bearer ${k.data.key}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'cloudgate/random-llama-eval', state: `state ${i}`, questions: { a: { type: 'boolean' }, b: { type: 'score', criteria: ['lo', 'hi'] } } }),
        })
          .then((r) => r.json() as Promise<any>)
          .then((b) => (evalInput += b.usage.inputTokens)),
      );
      // cancelled mid-stream
      work.push(
        (async () => {
          const s = await openai.chat.completions.create({ model: chat, messages: [{ role: 'user', content: `long ${i}` }], max_tokens: 300, temperature: 1, stream: true });
          let n = 0;
          // Leaving the loop is the SDK's way to cancel: it aborts the request and closes the connection.
          // (Calling abort() from inside the loop once left a read pending forever in the SDK.)
          for await (const _ of s) if (++n === 4) break;
        })(),
      );
    }
    await Promise.all(work);
    await new Promise((r) => setTimeout(r, 300)); // cancelled sequences settle
    const promptTokens = await metricSum(d.inferenceUrl, 'vllm:prompt_tokens_total', `model_name="${chat}"`);
    const generated = await metricSum(d.inferenceUrl, 'vllm:generation_tokens_total', `model_name="${chat}"`);
    expect(promptTokens).toBeGreaterThan(0);
    expect(generated).toBeGreaterThan(0);
    expect(await stopDaemon(d)).toBe(0);

    // Restart on the same data: what the ledger holds is what was charged.
    const d2 = await startDaemon(env, dataDir);
    const w = await fetch(`${d2.platformUrl}/api/v1/billing/wallet`, { headers: { authorization: `Bearer ${k.data.key}` } }).then((r) => r.json() as Promise<any>);
    await stopDaemon(d2);
    const chargedUnits = Math.round((START / 10_000 - w.balance_usd) * 10_000);
    const expectedUnits = (promptTokens * IN_PRICE + generated * OUT_PRICE + evalInput * EVAL_IN_PRICE) / 100;
    expect(chargedUnits).toBe(expectedUnits);
    fs.rmSync(dataDir, { recursive: true, force: true });
    fs.rmSync(modelsDir, { recursive: true, force: true });
  }, 120_000);
});
