import { afterAll, describe, expect, it } from 'vitest';
import type { Sql } from '../src/db/index.js';
import { recordRunUsageTx } from '../src/money/rft.js';
import { addMember, admin, call, newTeam, newUser } from './helpers.js';
import { conservation, ledgerOf, newRun, openDb, topup } from './money-helpers.js';

// Money end to end: admin top-up and refund with idempotency keys, the
// conservation of a wallet under concurrent writers, RFT run usage, invoices
// and the wallet view, against the shared daemon.

let db: Sql | undefined;
const sql = () => (db ??= openDb());
afterAll(async () => {
  await db?.end({ timeout: 1 });
});

const get = (key: string, p: string) => call('platform', 'GET', p, { key });

describe('admin top-up', () => {
  it('credits TOPUP and debits REFUND in units, answering the wallet transaction result', async () => {
    const u = await newUser(['billing:read']);
    const a = await topup({ userId: u.userId }, 123_456);
    expect(a.status).toBe(200);
    expect(a.body).toMatchObject({ status: 'success', data: { walletId: u.walletId, balance: 123_456, amount: 123_456, type: 'TOPUP' } });
    const b = await topup({ userId: u.userId }, 23_456, 'REFUND');
    expect(b.status).toBe(200);
    expect(b.body.data).toMatchObject({ walletId: u.walletId, balance: 100_000, amount: -23_456, type: 'REFUND' });
    const w = await get(u.key, '/api/v1/billing/wallet');
    expect(w.body).toMatchObject({ wallet_id: u.walletId, team_id: null, balance_usd: 10, currency: 'USD', total_billings: 0, recent_billings: [] });
    // A refund never takes the balance below zero.
    const over = await topup({ userId: u.userId }, 100_001, 'REFUND');
    expect(over.status).toBe(409);
    expect(over.body.errors[0].param).toBe('amount');
    expect(await conservation(sql(), u.walletId)).toEqual({ balance: 100_000, ledger: 100_000, listedAsMismatch: false });
  });

  it('credits a team wallet by teamId', async () => {
    const t = await newTeam();
    const r = await topup({ teamId: t.id }, 5000);
    expect(r.status).toBe(200);
    expect(r.body.data).toMatchObject({ walletId: t.walletId, balance: 5000, amount: 5000, type: 'TOPUP' });
  });

  it('refuses bad bodies with 422 naming the field, unknown owners with 404, other scopes with 403', async () => {
    const u = await newUser(['billing:read']);
    const bad = async (body: unknown) => (await admin('POST', '/api/admin/transactions/topup', body)) as { status: number; body: any };
    const both = await bad({ userId: u.userId, teamId: 'x', amount: 1, type: 'TOPUP' });
    expect(both.status).toBe(422);
    expect(both.body.errors.map((e: any) => e.param)).toEqual(['userId', 'teamId']);
    const neither = await bad({ amount: 1, type: 'TOPUP' });
    expect(neither.status).toBe(422);
    expect(neither.body.errors.map((e: any) => e.param)).toEqual(['userId', 'teamId']);
    for (const [body, param] of [
      [{ userId: u.userId, amount: 0, type: 'TOPUP' }, 'amount'],
      [{ userId: u.userId, amount: -5, type: 'TOPUP' }, 'amount'],
      [{ userId: u.userId, amount: 1.5, type: 'TOPUP' }, 'amount'],
      [{ userId: u.userId, amount: '100', type: 'TOPUP' }, 'amount'],
      [{ userId: u.userId, amount: 100, type: 'POD_CHARGE' }, 'type'],
      [{ userId: u.userId, amount: 100, type: 'VOID' }, 'type'],
      [{ userId: u.userId, amount: 100 }, 'type'],
    ] as const) {
      const r = await bad(body);
      expect(r.status, JSON.stringify(body)).toBe(422);
      expect(r.body.errors[0].param).toBe(param);
      expect(r.body.errors[0].details).toContain('got');
    }
    expect((await bad({ userId: 'no-such-user', amount: 1, type: 'TOPUP' })).status).toBe(404);
    expect((await bad({ teamId: 'no-such-team', amount: 1, type: 'TOPUP' })).status).toBe(404);
    const wrong = await newUser(['admin:invoices']);
    const r = await call('platform', 'POST', '/api/admin/transactions/topup', { key: wrong.key, body: { userId: u.userId, amount: 1, type: 'TOPUP' } });
    expect(r.status).toBe(403);
    expect((await ledgerOf(sql(), u.walletId)).length).toBe(0);
  });

  it('replays the first answer for the same Idempotency-Key and body, and refuses the key with another body', async () => {
    const u = await newUser(['billing:read']);
    const key = `topup-${u.userId}`;
    const first = await topup({ userId: u.userId }, 700, 'TOPUP', { 'idempotency-key': key });
    expect(first.status).toBe(200);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    const again = await topup({ userId: u.userId }, 700, 'TOPUP', { 'idempotency-key': key });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(first.body);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    const other = await topup({ userId: u.userId }, 701, 'TOPUP', { 'idempotency-key': key });
    expect(other.status).toBe(422);
    expect(other.body.errors[0].param).toBe('Idempotency-Key');
    // Concurrent retries of one request: one credit, the same answer for all.
    const key2 = `${key}-burst`;
    const burst = await Promise.all(Array.from({ length: 10 }, () => topup({ userId: u.userId }, 50, 'TOPUP', { 'idempotency-key': key2 })));
    expect(burst.map((r) => r.status)).toEqual(Array(10).fill(200));
    for (const r of burst) expect(r.body).toEqual(burst[0]!.body);
    // A refused first attempt stores nothing: the same key works once the request is valid.
    const key3 = `${key}-refused`;
    expect((await topup({ userId: u.userId }, 1_000_000, 'REFUND', { 'idempotency-key': key3 })).status).toBe(409);
    await topup({ userId: u.userId }, 1_000_000);
    expect((await topup({ userId: u.userId }, 1_000_000, 'REFUND', { 'idempotency-key': key3 })).status).toBe(200);
    const rows = await ledgerOf(sql(), u.walletId);
    expect(rows.map((r) => r.amount)).toEqual([700, 50, 1_000_000, -1_000_000]);
    expect(await conservation(sql(), u.walletId)).toEqual({ balance: 750, ledger: 750, listedAsMismatch: false });
    expect((await topup({ userId: u.userId }, 1, 'TOPUP', { 'idempotency-key': 'has space' })).status).toBe(422);
  });
});

describe('conservation', () => {
  it('50 concurrent top-ups, refunds and charges leave balance = start + sum of amounts = sum of the ledger', async () => {
    const u = await newUser(['billing:read']);
    const START = 10_000_000;
    await topup({ userId: u.userId }, START);
    // 100 USD per million tokens: one unit per training token, so charges are exact.
    const run = await newRun(u.userId, { training_per_mtok: 100, inference_input_per_mtok: 0, inference_output_per_mtok: 0 });
    const ops = Array.from({ length: 50 }, (_, i) => {
      const amount = 1000 + i * 37;
      if (i % 3 === 0) return topup({ userId: u.userId }, amount).then((r) => (expect(r.status).toBe(200), amount));
      if (i % 3 === 1) return topup({ userId: u.userId }, amount, 'REFUND').then((r) => (expect(r.status).toBe(200), -amount));
      return admin('POST', `/api/admin/rft/runs/${run.id}/usage`, { trainingTokens: amount }).then((r) => (expect(r.status).toBe(200), -amount));
    });
    const amounts = await Promise.all(ops);
    const expected = START + amounts.reduce((s, a) => s + a, 0);
    const c = await conservation(sql(), u.walletId);
    expect(c).toEqual({ balance: expected, ledger: expected, listedAsMismatch: false });
    // Each row's balance_after is the previous one plus its amount: no update was lost or reordered.
    const rows = await ledgerOf(sql(), u.walletId);
    expect(rows.length).toBe(51);
    let running = 0;
    for (const r of rows) {
      running += r.amount;
      expect(r.balance_after).toBe(running);
    }
    expect(rows.filter((r) => r.type === 'TRAINING_CHARGE').length).toBe(16);
  });
});

describe('RFT run usage', () => {
  // Awkward prices: the arithmetic must still be tokens x rate / 1e6, exactly.
  const pricing = { training_per_mtok: 0.123457, inference_input_per_mtok: 0.35, inference_output_per_mtok: 1.75 };
  /** USD x 1e12, exact, as the test's own reference arithmetic. */
  const micro = (tokens: number, perMTok: number) => BigInt(tokens) * BigInt(Math.round(perMTok * 1e6));

  it('reports totals at the snapshot prices, growing as records arrive, to the owner only', async () => {
    const u = await newUser(['billing:read']);
    const stranger = await newUser(['billing:read']);
    const noPerm = await newUser(['teams:read']);
    await topup({ userId: u.userId }, 10_000_000);
    const run = await newRun(u.userId, pricing);
    const path = `/api/v1/billing/runs/${run.id}/usage`;
    const empty = await get(u.key, path);
    expect(empty.status).toBe(200);
    expect(empty.body).toEqual({
      run_id: run.id,
      run_name: expect.any(String),
      base_model: 'cloudgate/random-llama-chat',
      status: 'RUNNING',
      training: { tokens: 0, input_tokens: 0, output_tokens: 0, cost_usd: 0 },
      inference: { tokens: 0, input_tokens: 0, output_tokens: 0, cost_usd: 0 },
      total_tokens: 0,
      total_cost_usd: 0,
      pricing,
      record_count: 0,
    });
    expect((await get(stranger.key, path)).status).toBe(404);
    expect((await get(noPerm.key, path)).status).toBe(403);
    expect((await get(u.key, '/api/v1/billing/runs/no-such-run/usage')).status).toBe(404);

    const records = [
      { trainingTokens: 1_234_567 },
      { trainingTokens: 3, inputTokens: 999, outputTokens: 1 },
      { inputTokens: 7_777_777, outputTokens: 333_333 },
    ];
    let training = 0;
    let input = 0;
    let output = 0;
    for (const rec of records) {
      const r = await admin('POST', `/api/admin/rft/runs/${run.id}/usage`, rec);
      expect(r.status).toBe(200);
      training += rec.trainingTokens ?? 0;
      input += rec.inputTokens ?? 0;
      output += rec.outputTokens ?? 0;
    }
    // Gateway inference carrying X-RFT-Run-ID is counted as the charger counts it (and charged
    // elsewhere, at the model's prices); a run that does not exist is not.
    const counted = await sql().begin((tx) => recordRunUsageTx(tx, [{ runId: run.id, input: 1000, output: 250 }, { runId: 'no-such-run', input: 1000, output: 250 }]));
    expect(counted).toBe(1);
    input += 1000;
    output += 250;

    const r = await get(u.key, path);
    expect(r.status).toBe(200);
    const b = r.body;
    const tCost = micro(training, pricing.training_per_mtok);
    const iCost = micro(input, pricing.inference_input_per_mtok) + micro(output, pricing.inference_output_per_mtok);
    expect(b.record_count).toBe(4);
    expect(b.training).toEqual({ tokens: training, input_tokens: 0, output_tokens: 0, cost_usd: Number(tCost) / 1e12 });
    expect(b.inference).toEqual({ tokens: input + output, input_tokens: input, output_tokens: output, cost_usd: Number(iCost) / 1e12 });
    expect(b.training.cost_usd).toBeCloseTo((training * pricing.training_per_mtok) / 1e6, 12);
    expect(b.inference.cost_usd).toBeCloseTo((input * pricing.inference_input_per_mtok + output * pricing.inference_output_per_mtok) / 1e6, 12);
    expect(b.total_tokens).toBe(b.training.tokens + b.inference.tokens);
    expect(b.total_cost_usd).toBeCloseTo(b.training.cost_usd + b.inference.cost_usd, 12);

    // The wallet was charged for the admin records only (gateway tokens are billed by the gateway),
    // exactly floor of the exact cost in units: rounding does not add up across records.
    const charged = micro(training, pricing.training_per_mtok) + micro(input - 1000, pricing.inference_input_per_mtok) + micro(output - 250, pricing.inference_output_per_mtok);
    const units = Number(charged / 100_000_000n);
    const c = await conservation(sql(), u.walletId);
    expect(c).toEqual({ balance: 10_000_000 - units, ledger: 10_000_000 - units, listedAsMismatch: false });

    const patched = await admin('PATCH', `/api/admin/rft/runs/${run.id}`, { status: 'COMPLETED' });
    expect(patched.status).toBe(200);
    expect((await get(u.key, path)).body.status).toBe('COMPLETED');
  });

  it('lets members read a team run, bills the team wallet, and validates run creation', async () => {
    const owner = await newUser(['billing:read']);
    const member = await newUser(['billing:read']);
    const outsider = await newUser(['billing:read']);
    const team = await newTeam();
    await addMember(team.id, owner.userId, 'ADMIN');
    await addMember(team.id, member.userId);
    const run = await newRun(owner.userId, pricing, team.id);
    expect(run.walletId).toBe(team.walletId);
    await admin('POST', `/api/admin/rft/runs/${run.id}/usage`, { trainingTokens: 10_000_000 });
    expect((await get(member.key, `/api/v1/billing/runs/${run.id}/usage`)).body.training.tokens).toBe(10_000_000);
    expect((await get(outsider.key, `/api/v1/billing/runs/${run.id}/usage`)).status).toBe(404);
    expect((await conservation(sql(), team.walletId)).balance).toBe(-12_345); // 10M tokens x 0.123457 USD/MTok = 1.23457 USD
    const bad = async (body: unknown) => (await admin('POST', '/api/admin/rft/runs', body)).status;
    const base = { name: 'r', baseModel: 'm', userId: owner.userId, pricing };
    expect(await bad({ ...base, teamId: (await newTeam()).id })).toBe(422); // owner not a member
    expect(await bad({ ...base, pricing: { ...pricing, training_per_mtok: 0.1234567 } })).toBe(422);
    expect(await bad({ ...base, pricing: { training_per_mtok: 1 } })).toBe(422);
    expect(await bad({ ...base, userId: 'nobody' })).toBe(404);
    expect((await admin('POST', `/api/admin/rft/runs/${run.id}/usage`, {})).status).toBe(422);
    expect((await admin('POST', `/api/admin/rft/runs/${run.id}/usage`, { trainingTokens: -1 })).status).toBe(422);
    expect((await admin('POST', '/api/admin/rft/runs/nope/usage', { trainingTokens: 1 })).status).toBe(404);
  });
});

describe('invoices', () => {
  async function charged(units: number) {
    const u = await newUser(['billing:read']);
    await topup({ userId: u.userId }, 1_000_000);
    const run = await newRun(u.userId, { training_per_mtok: 100, inference_input_per_mtok: 0, inference_output_per_mtok: 0 });
    await admin('POST', `/api/admin/rft/runs/${run.id}/usage`, { trainingTokens: units });
    return { ...u, runId: run.id };
  }

  it('issues an invoice for the charges since the last one; cancel voids it and records VOID on its transaction', async () => {
    const u = await charged(25_000);
    const inv = await admin('POST', `/api/admin/invoices/${u.walletId}`);
    expect(inv.status).toBe(201);
    const i1 = inv.body.data;
    expect(i1).toMatchObject({ walletId: u.walletId, status: 'OPEN', amount: 2.5, currency: 'USD', lines: [{ resourceType: 'training', amount: 2.5, charges: 1 }] });
    expect(i1.providerTransactionId).toMatch(/^in_/);
    let tx = (await ledgerOf(sql(), u.walletId)).find((t) => t.type === 'INVOICE')!;
    expect(tx).toMatchObject({ amount: 0, status: 'OPEN', provider_transaction_id: i1.providerTransactionId, ref_id: i1.id });
    // Nothing new to invoice.
    expect((await admin('POST', `/api/admin/invoices/${u.walletId}`)).status).toBe(409);

    // Another wallet's path never reaches this invoice.
    const other = await newUser(['billing:read']);
    const cross = await admin('POST', `/api/admin/invoices/${other.walletId}/${i1.providerTransactionId}/cancel`);
    expect(cross.status).toBe(404);
    expect((await admin('POST', `/api/admin/invoices/${u.walletId}/in_unknown/cancel`)).status).toBe(404);
    expect((await admin('POST', `/api/admin/invoices/no-such-wallet/${i1.providerTransactionId}/cancel`)).status).toBe(404);

    const scoped = await newUser(['admin:wallets']);
    expect((await call('platform', 'POST', `/api/admin/invoices/${u.walletId}/${i1.providerTransactionId}/cancel`, { key: scoped.key })).status).toBe(403);

    const cancel = await admin('POST', `/api/admin/invoices/${u.walletId}/${i1.providerTransactionId}/cancel`);
    expect(cancel.status).toBe(200);
    expect(cancel.body).toEqual({ data: {}, status: 'success' });
    tx = (await ledgerOf(sql(), u.walletId)).find((t) => t.type === 'INVOICE')!;
    expect(tx.status).toBe('VOID');
    const again = await admin('POST', `/api/admin/invoices/${u.walletId}/${i1.providerTransactionId}/cancel`);
    expect(again.status).toBe(409);

    // The next invoice starts where the first ended; once paid it cannot be voided.
    await admin('POST', `/api/admin/rft/runs/${u.runId}/usage`, { trainingTokens: 1234 });
    const i2 = (await admin('POST', `/api/admin/invoices/${u.walletId}`)).body.data;
    expect(i2).toMatchObject({ status: 'OPEN', amount: 0.1234, periodStart: i1.periodEnd });
    expect((await admin('POST', `/api/admin/invoices/${u.walletId}/${i2.providerTransactionId}/pay`)).body.data.status).toBe('PAID');
    expect((await admin('POST', `/api/admin/invoices/${u.walletId}/${i2.providerTransactionId}/cancel`)).status).toBe(409);
    expect((await admin('POST', `/api/admin/invoices/${u.walletId}/${i2.providerTransactionId}/pay`)).status).toBe(409);
    const list = await admin('GET', `/api/admin/invoices/${u.walletId}`);
    expect(list.body.data.map((i: any) => [i.providerTransactionId, i.status])).toEqual([
      [i2.providerTransactionId, 'PAID'],
      [i1.providerTransactionId, 'VOID'],
    ]);
    expect((await ledgerOf(sql(), u.walletId)).filter((t) => t.type === 'INVOICE').map((t) => t.status)).toEqual(['VOID', 'PAID']);
    expect((await conservation(sql(), u.walletId)).listedAsMismatch).toBe(false);
  });

  it('concurrent issuers never invoice a charge twice', async () => {
    const u = await charged(5000);
    const rs = await Promise.all(Array.from({ length: 4 }, () => admin('POST', `/api/admin/invoices/${u.walletId}`)));
    expect(rs.map((r) => r.status).sort()).toEqual([201, 409, 409, 409]);
  });
});

describe('GET /api/v1/billing/wallet', () => {
  it('shows the caller or a team they belong to, with billings per resource; other teams are 404', async () => {
    const u = await newUser(['billing:read']);
    const team = await newTeam();
    await addMember(team.id, u.userId);
    await topup({ teamId: team.id }, 2_000_000);
    const runs = [await newRun(u.userId, { training_per_mtok: 100, inference_input_per_mtok: 0, inference_output_per_mtok: 0 }, team.id)];
    runs.push(await newRun(u.userId, { training_per_mtok: 100, inference_input_per_mtok: 0, inference_output_per_mtok: 0 }, team.id));
    for (const [run, tokens] of [[runs[0]!, 1000], [runs[1]!, 3000], [runs[0]!, 500]] as const) {
      await admin('POST', `/api/admin/rft/runs/${run.id}/usage`, { trainingTokens: tokens });
    }
    const w = await get(u.key, `/api/v1/billing/wallet?teamId=${team.id}`);
    expect(w.status).toBe(200);
    expect(w.body).toMatchObject({ wallet_id: team.walletId, team_id: team.id, balance_usd: 199.55, currency: 'USD', total_billings: 2 });
    expect(w.body.recent_billings).toEqual([
      { id: expect.any(String), created_at: expect.any(String), updated_at: expect.any(String), last_billed_at: expect.any(String), amount_usd: 0.15, currency: 'USD', resource_type: 'training', resource_id: runs[0]!.id },
      expect.objectContaining({ amount_usd: 0.3, resource_type: 'training', resource_id: runs[1]!.id }),
    ]);
    const paged = await get(u.key, `/api/v1/billing/wallet?teamId=${team.id}&limit=1&offset=1`);
    expect(paged.body.recent_billings.map((b: any) => b.resource_id)).toEqual([runs[1]!.id]);
    expect(paged.body.total_billings).toBe(2);
    const mine = await get(u.key, '/api/v1/billing/wallet');
    expect(mine.body).toMatchObject({ wallet_id: u.walletId, team_id: null, balance_usd: 0, total_billings: 0 });
    const outsider = await newUser(['billing:read']);
    expect((await get(outsider.key, `/api/v1/billing/wallet?teamId=${team.id}`)).status).toBe(404);
    expect((await get(u.key, '/api/v1/billing/wallet?limit=0')).status).toBe(422);
    expect((await get(u.key, '/api/v1/billing/wallet?limit=101')).status).toBe(422);
  });
});
