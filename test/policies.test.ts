import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { addMember, admin, call, daemon, fund, newTeam, newUser } from './helpers.js';

const CHAT = 'cloudgate/random-llama-chat';
const chatBody = (extra: Record<string, unknown> = {}) => ({ model: CHAT, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0, ...extra });
const RL_HEADERS = [
  'x-ratelimit-limit-requests',
  'x-ratelimit-limit-tokens',
  'x-ratelimit-remaining-requests',
  'x-ratelimit-remaining-tokens',
  'x-ratelimit-reset-requests',
  'x-ratelimit-reset-tokens',
];

describe('rate limits', () => {
  it('refuses the third request of a 2-per-minute key with 429, Retry-After and the OpenAI body', async () => {
    const u = await newUser(['inference:use'], { requestsPerMinute: 2 });
    await fund(u.userId, 100_000);
    for (let i = 0; i < 2; i++) expect((await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody() })).status).toBe(200);
    const r = await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody() });
    expect(r.status).toBe(429);
    expect(r.body.error).toMatchObject({ type: 'rate_limit_error', code: 'rate_limit_exceeded' });
    expect(r.body.error.message).toContain('2 requests per minute');
    expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(Number(r.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(r.headers.get('x-ratelimit-remaining-requests')).toBe('0');
    const sdk = new OpenAI({ baseURL: `${daemon().inferenceUrl}/api/v1`, apiKey: u.key, maxRetries: 0 });
    await expect(sdk.chat.completions.create(chatBody() as never)).rejects.toMatchObject({ status: 429, code: 'rate_limit_exceeded' });
  });

  it("changes a key's own limits in place with PATCH /api/admin/api-keys/{id}, validated, from the next request", async () => {
    const u = await newUser(['inference:use'], { requestsPerMinute: 1 });
    await fund(u.userId, 100_000);
    const chat = () => call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody() });
    expect((await chat()).status).toBe(200);
    expect((await chat()).status).toBe(429);
    const patched = await admin('PATCH', `/api/admin/api-keys/${u.keyId}`, { rateLimits: { requestsPerMinute: 100 } });
    expect(patched.status).toBe(200);
    expect(patched.body.data).toMatchObject({ id: u.keyId, userId: u.userId, rateLimits: { requestsPerMinute: 100 } });
    const r = await chat();
    expect(r.status).toBe(200);
    expect(r.headers.get('x-ratelimit-limit-requests')).toBe('100');
    // null: back to the configured defaults
    expect((await admin('PATCH', `/api/admin/api-keys/${u.keyId}`, { rateLimits: null })).status).toBe(200);
    expect((await chat()).headers.get('x-ratelimit-limit-requests')).not.toBe('100');
    const bad = await admin('PATCH', `/api/admin/api-keys/${u.keyId}`, { rateLimits: { requestsPerMinute: -1 } });
    expect(bad.status).toBe(422);
    expect(bad.body.errors[0].param).toBe('rateLimits.requestsPerMinute');
    expect((await admin('PATCH', '/api/admin/api-keys/no-such-key', { rateLimits: null })).status).toBe(404);
    expect((await call('platform', 'PATCH', `/api/admin/api-keys/${u.keyId}`, { key: u.key, body: { rateLimits: null } })).status).toBe(403);
  });

  it('counts tokens: prompt plus max_tokens are reserved at admission', async () => {
    const u = await newUser(['inference:use'], { tokensPerMinute: 200 });
    await fund(u.userId, 100_000);
    const r = await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody({ max_tokens: 300 }) });
    expect(r.status).toBe(429);
    expect(r.body.error.message).toContain('200 tokens per minute');
  });

  it('puts the rate-limit headers on plain, streamed and evaluation answers', async () => {
    const u = await newUser(['inference:use'], { requestsPerMinute: 100, tokensPerMinute: 100_000 });
    await fund(u.userId, 100_000);
    const plain = await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody() });
    const res = await fetch(`${daemon().inferenceUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${u.key}`, 'content-type': 'application/json' },
      body: JSON.stringify(chatBody({ stream: true })),
    });
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const text = await res.text();
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    const ev = await call('inference', 'POST', '/api/v1/evaluations', {
      key: u.key,
      body: { model: 'cloudgate/random-llama-eval', state: 'x', questions: { q: { type: 'boolean' } } },
    });
    expect(ev.status).toBe(200);
    for (const h of RL_HEADERS) {
      expect(plain.headers.get(h), h).not.toBeNull();
      expect(res.headers.get(h), h).not.toBeNull();
      expect(ev.headers.get(h), h).not.toBeNull();
    }
    expect(plain.headers.get('x-ratelimit-limit-requests')).toBe('100');
  });
});

describe('quota and team billing', () => {
  it('answers 402 insufficient_quota with x-should-retry false for an empty wallet, before any model work', async () => {
    const u = await newUser(['inference:use']);
    const r = await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody() });
    expect(r.status).toBe(402);
    expect(r.body.error).toMatchObject({ type: 'insufficient_quota', code: 'insufficient_quota' });
    expect(r.headers.get('x-should-retry')).toBe('false');
  });

  it('refuses X-Service-Team-ID for a non-member with 403 and charges the team for a member', async () => {
    const u = await newUser(['inference:use', 'billing:read']);
    const team = await newTeam();
    await fund(team.id, 100_000, 'teamId');
    const no = await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody(), headers: { 'x-service-team-id': team.id } });
    expect(no.status).toBe(403);
    expect(no.body.error.type).toBe('permission_error');
    await addMember(team.id, u.userId);
    // personal wallet is empty: the request only passes because the team pays
    const yes = await call('inference', 'POST', '/api/v1/chat/completions', {
      key: u.key,
      body: chatBody({ max_tokens: 64, messages: [{ role: 'user', content: 'word '.repeat(100) }] }),
      headers: { 'x-service-team-id': team.id },
    });
    expect(yes.status).toBe(200);
    // Tokens are attributed to the team (the ledger arithmetic itself is checked in charging.test.ts,
    // with prices high enough to move whole units).
    const m = await call('inference', 'GET', '/metrics');
    const line = (m.body as string).split('\n').find((l) => l.startsWith('inference_team_tokens_total{') && l.includes(`team="${team.id}"`) && l.includes('direction="input"'));
    expect(Number(line?.split(' ').pop())).toBe(yes.body.usage.prompt_tokens);
  });
});

describe("Prime's team header", () => {
  it('takes X-Prime-Team-ID as X-Service-Team-ID: same membership rule, the team pays; two different teams is a 400', async () => {
    const u = await newUser(['inference:use']);
    const team = await newTeam();
    const other = await newTeam();
    await fund(team.id, 100_000, 'teamId');
    const chat = (headers: Record<string, string>) => call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: chatBody(), headers });
    const stranger = await chat({ 'x-prime-team-id': team.id });
    expect(stranger.status).toBe(403);
    expect(stranger.body.error).toMatchObject({ type: 'permission_error', code: 'team_access_denied', param: 'x-prime-team-id' });
    await addMember(team.id, u.userId);
    await addMember(other.id, u.userId);
    // The personal wallet is empty: only the team named by Prime's header can pay.
    const yes = await chat({ 'x-prime-team-id': team.id });
    expect(yes.status).toBe(200);
    expect((await chat({ 'x-prime-team-id': team.id, 'x-service-team-id': team.id })).status).toBe(200);
    const both = await chat({ 'x-prime-team-id': other.id, 'x-service-team-id': team.id });
    expect(both.status).toBe(400);
    expect(both.body.error).toMatchObject({ type: 'invalid_request_error', code: 'conflicting_team_headers', param: 'x-prime-team-id' });
    expect(both.body.error.message).toContain(team.id);
    expect(both.body.error.message).toContain(other.id);
    // Without either header the empty personal wallet is what pays: 402.
    expect((await chat({})).status).toBe(402);
  });
});

describe('RFT run attribution', () => {
  it('counts a request carrying X-RFT-Run-ID against its own run, and refuses a run that is not the caller\'s with 404', async () => {
    const owner = await newUser(['inference:use', 'billing:read']);
    const stranger = await newUser(['inference:use']);
    await fund(owner.userId, 1_000_000);
    await fund(stranger.userId, 1_000_000);
    const pricing = { training_per_mtok: 1, inference_input_per_mtok: 0.5, inference_output_per_mtok: 2 };
    const created = await admin('POST', '/api/admin/rft/runs', { name: `run-${Date.now()}`, baseModel: CHAT, userId: owner.userId, pricing });
    expect(created.status).toBe(201);
    const runId = created.body.data.id as string;

    const foreign = await call('inference', 'POST', '/api/v1/chat/completions', { key: stranger.key, body: chatBody(), headers: { 'x-rft-run-id': runId } });
    expect(foreign.status).toBe(404);
    expect(foreign.body.error).toMatchObject({ code: 'run_not_found', param: 'x-rft-run-id' });
    const unknown = await call('inference', 'POST', '/api/v1/chat/completions', { key: owner.key, body: chatBody(), headers: { 'x-rft-run-id': 'no-such-run' } });
    expect(unknown.status).toBe(404);

    // A client polling the live run sees its totals grow as requests finish.
    let expected = 0;
    for (let i = 0; i < 2; i++) {
      const r = await call('inference', 'POST', '/api/v1/chat/completions', { key: owner.key, body: chatBody({ max_tokens: 8 }), headers: { 'x-rft-run-id': runId } });
      expect(r.status).toBe(200);
      expected += r.body.usage.prompt_tokens + r.body.usage.completion_tokens;
      let seen = -1;
      for (let t = 0; t < 100 && seen !== expected; t++) {
        const u = await call('platform', 'GET', `/api/v1/billing/runs/${runId}/usage`, { key: owner.key });
        expect(u.status).toBe(200);
        seen = u.body.inference.tokens;
        if (seen !== expected) await new Promise((res) => setTimeout(res, 50));
      }
      expect(seen).toBe(expected);
    }
  });
});
