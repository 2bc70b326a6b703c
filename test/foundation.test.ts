import fs from 'node:fs';
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { addMember, admin, call, daemon, fund, newTeam, newUser } from './helpers.js';
import { KEEP_ALIVE_HINT_S } from '../src/http/context.js';

/** The access-log lines whose request id starts with `tag`, once `n` are written (they are buffered up to a second). */
async function logLines(tag: string, n: number): Promise<Array<Record<string, any>>> {
  let lines: Array<Record<string, any>> = [];
  for (let i = 0; i < 50 && lines.length < n; i++) {
    await new Promise((res) => setTimeout(res, 100));
    lines = fs.readFileSync(daemon().logFile, 'utf8').split('\n').filter((l) => l.includes(`"reqId":"${tag}`)).map((l) => JSON.parse(l));
  }
  expect(lines).toHaveLength(n);
  return lines;
}

describe('auth', () => {
  it('answers 401 in the platform body without a key, with a bad scheme and with an unknown key', async () => {
    for (const headers of [{}, { authorization: 'Basic abc' }, { authorization: 'Bearer cg_nope' }]) {
      const r = await call('platform', 'POST', '/api/admin/users', { key: null, headers, body: { name: 'x', email: 'x@y.z' } });
      expect(r.status).toBe(401);
      expect(r.body.errors[0].param).toBe('authorization');
      expect(typeof r.body.errors[0].details).toBe('string');
    }
  });

  it('answers 403 when the key lacks the admin scope, and admin:* passes', async () => {
    const u = await newUser(['instances:read']);
    const r = await call('platform', 'POST', '/api/admin/users', { key: u.key, body: { name: 'x', email: 'x2@y.z' } });
    expect(r.status).toBe(403);
    expect(r.body.errors[0].details).toContain('admin:users');
    const scoped = await newUser(['admin:users']);
    const ok = await call('platform', 'POST', '/api/admin/users', { key: scoped.key, body: { name: 'y', email: `y-${Date.now()}@test.io` } });
    expect(ok.status).toBe(201);
    const wrongScope = await newUser(['admin:wallets']);
    const no = await call('platform', 'POST', '/api/admin/users', { key: wrongScope.key, body: { name: 'y', email: 'z@y.z' } });
    expect(no.status).toBe(403);
  });

  it('answers 401 in the inference body on the inference address', async () => {
    const r = await call('inference', 'GET', '/api/v1/models', { key: 'cg_wrong' });
    expect(r.status).toBe(401);
    expect(r.body.error).toMatchObject({ type: 'authentication_error', code: 'invalid_api_key' });
  });

  it('issues keys that are never stored in clear and rejects unknown permissions', async () => {
    const u = await admin('POST', '/api/admin/users', { name: 'k', email: `k-${Date.now()}@t.io` });
    const bad = await admin('POST', '/api/admin/api-keys', { userId: u.body.data.id, permissions: ['pods:fly'] });
    expect(bad.status).toBe(422);
    expect(bad.body.errors[0].param).toBe('permissions.0');
    expect(bad.body.errors[0].details).toContain('"pods:fly"');
    const k = await admin('POST', '/api/admin/api-keys', { userId: u.body.data.id, permissions: ['teams:read'] });
    expect(k.status).toBe(201);
    expect(k.body.data.key).toMatch(/^cg_[A-Za-z0-9_-]{43}$/);
  });

  it('refuses a duplicate email with 409 and a team member for an unknown user with 404', async () => {
    const email = `dup-${Date.now()}@t.io`;
    expect((await admin('POST', '/api/admin/users', { name: 'a', email })).status).toBe(201);
    const again = await admin('POST', '/api/admin/users', { name: 'b', email });
    expect(again.status).toBe(409);
    const t = await admin('POST', '/api/admin/teams', { name: 'Team Dup' });
    expect(t.status).toBe(201);
    expect(t.body.data.slug).toMatch(/^team-dup/);
    const m = await admin('POST', `/api/admin/teams/${t.body.data.id}/members`, { userId: 'nobody', role: 'MEMBER' });
    expect(m.status).toBe(404);
    expect(m.body.errors[0].param).toBe('userId');
  });
});

describe('HTTP core', () => {
  it('answers bad JSON with 400 and a body over the limit with 413', async () => {
    const bad = await call('platform', 'POST', '/api/admin/users', { raw: '{"name":', headers: { 'content-type': 'application/json' } });
    expect(bad.status).toBe(400);
    expect(bad.body.errors[0].details).toContain('not valid JSON');
    const big = Buffer.alloc((1 << 20) + 1, 0x20);
    const r = await call('platform', 'POST', '/api/admin/users', { raw: big, headers: { 'content-type': 'application/json' } });
    expect(r.status).toBe(413);
    expect(r.body.errors[0].details).toContain('1048576');
    // exactly at the limit is read (and then judged on its content)
    const atLimit = Buffer.alloc(1 << 20, 0x20);
    atLimit.write('{"name":"a","email":"bad"}');
    const ok = await call('platform', 'POST', '/api/admin/users', { raw: atLimit, headers: { 'content-type': 'application/json' } });
    expect(ok.status).toBe(422);
  });

  it('answers 413 for a chunked body that grows past the limit without a content-length', async () => {
    const d = daemon();
    const chunk = Buffer.alloc(256 * 1024, 0x20);
    let sent = 0;
    const stream = new ReadableStream({
      pull(c) {
        if (sent++ < 8) c.enqueue(chunk);
        else c.close();
      },
    });
    const res = await fetch(`${d.platformUrl}/api/admin/users`, {
      method: 'POST',
      headers: { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' },
      body: stream,
      duplex: 'half',
    } as RequestInit).catch((e) => e as Error);
    // The server answers 413 and closes; depending on timing fetch sees the 413 or a reset.
    if (res instanceof Response) expect(res.status).toBe(413);
    else expect(String(res)).toMatch(/fetch failed|socket|reset|closed/i);
  });

  it('answers with and without the trailing slash, and 404/405 in the family body', async () => {
    const a = await call('platform', 'GET', '/healthz/');
    expect(a.status).toBe(200);
    const nf = await call('platform', 'GET', '/api/v1/nothing-here');
    expect(nf.status).toBe(404);
    expect(nf.body.errors[0].details).toContain('/api/v1/nothing-here');
    const na = await call('platform', 'DELETE', '/healthz');
    expect(na.status).toBe(405);
    expect(na.headers.get('allow')).toBe('GET');
    const inf = await call('inference', 'GET', '/api/v1/nothing');
    expect(inf.status).toBe(404);
    expect(inf.body.error.type).toBe('invalid_request_error');
  });

  it('puts an X-Request-Id on every answer and keeps a sane one given by the client', async () => {
    const r = await call('platform', 'GET', '/healthz', { headers: { 'x-request-id': 'trace-abc.123' } });
    expect(r.headers.get('x-request-id')).toBe('trace-abc.123');
    const g = await call('platform', 'GET', '/nope', { headers: { 'x-request-id': 'bad id with spaces' } });
    expect(g.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('keep-alive', () => {
  // A pooled client reuses an idle connection as long as the hint says: the daemon must not close it sooner.
  it('announces how long an idle connection stays open, and keeps it open that long', async () => {
    const u = new URL(daemon().inferenceUrl);
    const sock = net.connect(Number(u.port), u.hostname);
    await new Promise((ok, fail) => sock.once('connect', ok).once('error', fail));
    let got = '';
    sock.on('data', (b) => (got += b));
    let closed = false;
    sock.on('close', () => (closed = true));
    const answer = async () => {
      got = '';
      sock.write(`GET /healthz HTTP/1.1\r\nHost: ${u.host}\r\n\r\n`);
      for (let i = 0; i < 100 && !/\r\n\r\n[\s\S]*\}/.test(got); i++) await new Promise((r) => setTimeout(r, 20));
      return got;
    };
    try {
      expect(await answer()).toMatch(new RegExp(`^HTTP/1.1 200 OK\r\n[\\s\\S]*keep-alive: timeout=${KEEP_ALIVE_HINT_S}\r\n`, 'i'));
      await new Promise((r) => setTimeout(r, KEEP_ALIVE_HINT_S * 1000));
      expect(closed).toBe(false);
      expect(await answer()).toMatch(/^HTTP\/1.1 200 OK\r\n/);
    } finally {
      sock.destroy();
    }
  }, 20_000);
});

describe('request log', () => {
  it('writes one JSON line per request with its id, route, status and duration, and never the key', async () => {
    const u = await newUser(['teams:read']);
    const reqId = `log-${Date.now()}`;
    const r = await call('platform', 'GET', '/api/v1/user/teams/', { key: u.key, headers: { 'x-request-id': reqId } });
    expect(r.status).toBe(200);
    // Access lines are buffered for up to a second.
    let lines: Array<Record<string, unknown>> = [];
    for (let i = 0; i < 40 && !lines.length; i++) {
      await new Promise((res) => setTimeout(res, 100));
      const text = fs.readFileSync(daemon().logFile, 'utf8');
      expect(text).not.toContain(u.key);
      expect(text).not.toContain(daemon().adminKey);
      lines = text.split('\n').filter((l) => l.includes(reqId)).map((l) => JSON.parse(l));
    }
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 'info', msg: 'request', reqId, server: 'platform', method: 'GET', route: '/api/v1/user/teams', status: 200, user: u.userId, key: u.keyId });
    expect(typeof lines[0]!.ms).toBe('number');
  });

  it('answers "which model, how many tokens" and "why did this fail" in the access line', async () => {
    const u = await newUser(['inference:use', 'teams:read']);
    const team = await newTeam();
    await addMember(team.id, u.userId);
    await fund(team.id, 100_000, 'teamId');
    const tag = `log2-${Date.now()}`;
    const body = { model: 'cloudgate/random-llama-chat', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 5, temperature: 0 };
    const ok = await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body, headers: { 'x-request-id': `${tag}-a`, 'x-prime-team-id': team.id } });
    expect(ok.status).toBe(200);
    const streamed = await fetch(`${daemon().inferenceUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${u.key}`, 'content-type': 'application/json', 'x-request-id': `${tag}-b`, 'x-service-team-id': team.id },
      body: JSON.stringify({ ...body, stream: true }),
    });
    expect(streamed.status).toBe(200);
    await streamed.text();
    const bad = await call('inference', 'POST', '/api/v1/chat/completions', { key: u.key, body: { ...body, model: 'no-such-model' }, headers: { 'x-request-id': `${tag}-c` } });
    expect(bad.status).toBe(404);
    const lost = await call('platform', 'GET', '/api/v1/podz?x=1', { key: u.key, headers: { 'x-request-id': `${tag}-d` } });
    expect(lost.status).toBe(404);
    const legacy = await call('inference', 'POST', '/v1/completions', { key: u.key, body: { model: 'cloudgate/random-llama-chat', prompt: ['hello there', 'hello again'], max_tokens: 3, temperature: 0 }, headers: { 'x-request-id': `${tag}-e`, 'x-prime-team-id': team.id } });
    expect(legacy.status).toBe(200);
    const lines = await logLines(tag, 5);
    const line = (s: string) => lines.find((l) => l.reqId === `${tag}-${s}`)!;
    expect(line('a')).toMatchObject({
      level: 'info', status: 200, model: 'cloudgate/random-llama-chat', stream: false, promptTokens: ok.body.usage.prompt_tokens,
      completionTokens: ok.body.usage.completion_tokens, finishReason: ok.body.choices[0].finish_reason, inferenceId: ok.body.id, key: u.keyId, user: u.userId, team: team.id,
    });
    expect(line('a').inferenceId).toMatch(/^chatcmpl-/);
    expect(line('a').ttftMs).toBeGreaterThan(0);
    expect(line('a').ttftMs).toBeLessThanOrEqual(line('a').ms as number);
    expect(line('b')).toMatchObject({ status: 200, stream: true, model: 'cloudgate/random-llama-chat', team: team.id, finishReason: expect.any(String) });
    expect(line('b').completionTokens).toBeGreaterThan(0);
    expect(typeof line('b').ttftMs).toBe('number');
    // The same user's same prompt again started from a's kept generation: all but its last token.
    expect(line('a').cachedTokens).toBeUndefined();
    expect(line('b').cachedTokens).toBe(ok.body.usage.prompt_tokens - 1);
    // Legacy completions log their tokens too: every prompt's, summed as their usage is.
    expect(line('e')).toMatchObject({ status: 200, promptTokens: legacy.body.usage.prompt_tokens, completionTokens: legacy.body.usage.completion_tokens });
    expect(line('c')).toMatchObject({ status: 404, errorType: 'not_found', errorCode: 'model_not_found', route: '/api/v1/chat/completions' });
    expect(line('c').path).toBeUndefined();
    // The path a 404 did not match (without its query: queries may carry what a log must not keep).
    expect(line('d')).toMatchObject({ status: 404, route: 'unmatched', path: '/api/v1/podz', errorType: 'not_found', errorCode: 'not_found' });
    const text = fs.readFileSync(daemon().logFile, 'utf8');
    expect(text).not.toContain(u.key);
  });
});

describe('operations', () => {
  it('reports readiness and Prometheus metrics that count traffic', async () => {
    const ready = await call('platform', 'GET', '/readyz');
    expect(ready.status).toBe(200);
    expect(ready.body.checks.database).toBe('ok');
    await call('platform', 'GET', '/healthz');
    const m = await call('platform', 'GET', '/metrics');
    expect(m.status).toBe(200);
    expect(m.headers.get('content-type')).toContain('text/plain');
    expect(m.body).toMatch(/http_requests_total\{server="platform",route="\/healthz",method="GET",status="200"\} \d+/);
    expect(m.body).toContain('http_request_duration_seconds_bucket');
    expect(m.body).toContain('process_cpu_user_seconds_total');
  });
});
