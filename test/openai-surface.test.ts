import fs from 'node:fs';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { startDaemon, stopDaemon } from './daemon.js';
import { call, daemon, fund, newUser } from './helpers.js';

// Issue 15: what OpenAI-compatible tools expect when their base URL is http://host:port/v1.

const CHAT = 'cloudgate/random-llama-chat';
const EVAL = 'cloudgate/random-llama-eval';
const msgs = [{ role: 'user' as const, content: 'Once upon a time' }];

async function client() {
  const u = await newUser(['inference:use']);
  await fund(u.userId, 100_000);
  return { ...u, openai: new OpenAI({ baseURL: `${daemon().inferenceUrl}/v1`, apiKey: u.key, maxRetries: 0 }) };
}

describe('/v1 base URL', () => {
  it('serves models (with max_model_len and kind) and chat under /v1 as under /api/v1', async () => {
    const { openai, key } = await client();
    const list = await openai.models.list();
    const chat = list.data.find((m) => m.id === CHAT) as unknown as Record<string, unknown>;
    expect(chat).toMatchObject({ object: 'model', kind: 'chat', max_model_len: expect.any(Number) });
    expect(list.data.find((m) => m.id === EVAL)).toMatchObject({ kind: 'evaluation' });
    const a = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 6, temperature: 0 });
    const b = await call('inference', 'POST', '/api/v1/chat/completions', { key, body: { model: CHAT, messages: msgs, max_tokens: 6, temperature: 0 } });
    expect(a.choices[0]!.message.content).toBe(b.body.choices[0].message.content);
    expect(a.usage!.prompt_tokens).toBeGreaterThan(0);
  });

  it('answers a 404 on another prefix naming /v1', async () => {
    const { key } = await client();
    const r = await call('inference', 'POST', '/openai/chat/completions', { key, body: {} });
    expect(r.status).toBe(404);
    expect(r.body.error.message).toContain('/v1');
  });

  it('answers /health and /version on both ports', async () => {
    for (const port of ['platform', 'inference'] as const) {
      expect((await call(port, 'GET', '/health', { key: null })).status).toBe(200);
      const v = await call(port, 'GET', '/version', { key: null });
      expect(v.body.version).toBe(JSON.parse(fs.readFileSync('package.json', 'utf8')).version);
    }
  });
});

describe('parameters are honoured or refused, never ignored', () => {
  const refused: Array<[string, Record<string, unknown>, string]> = [
    ['response_format json_object', { response_format: { type: 'json_object' } }, 'response_format.type'],
    ['tools without tool_choice none', { tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }, 'tools'],
    ['tool_choice auto', { tool_choice: 'auto' }, 'tool_choice'],
    ['logprobs', { logprobs: true }, 'logprobs'],
    ['top_logprobs', { top_logprobs: 3 }, 'top_logprobs'],
    ['an unknown parameter', { best_of: 2 }, 'best_of'],
    ['five stop strings', { stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
    ['a logit_bias over 100', { logit_bias: { '5': 101 } }, 'logit_bias.5'],
    ['a logit_bias key past the vocabulary', { logit_bias: { '999999': 1 } }, 'logit_bias.999999'],
    ['stream_options keys other than include_usage', { stream: true, stream_options: { continuous_usage_stats: true } }, 'stream_options.continuous_usage_stats'],
  ];
  for (const [what, extra, param] of refused) {
    it(`refuses ${what} with a 400 naming ${param}`, async () => {
      const { key } = await client();
      const r = await call('inference', 'POST', '/v1/chat/completions', { key, body: { model: CHAT, messages: msgs, max_tokens: 4, ...extra } });
      expect(r.status).toBe(400);
      expect(r.body.error).toMatchObject({ type: 'invalid_request_error', param });
      expect(r.body.error.message).toContain(param);
    });
  }

  it('accepts tools listed with tool_choice "none"', async () => {
    const { openai } = await client();
    const r = await openai.chat.completions.create({
      model: CHAT, messages: msgs, max_tokens: 3, temperature: 0, tool_choice: 'none',
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
    });
    expect(r.choices[0]!.finish_reason).toBe('length');
  });

  it('applies logit_bias: +100 forces a token, -100 bans the greedy one', async () => {
    const { openai, key } = await client();
    const greedy = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 1, temperature: 0 });
    // Ban every token that could have written the greedy text (with and without a leading space).
    const ids = async (prompt: string) => (await call('inference', 'POST', '/tokenize', { key, body: { model: CHAT, prompt, add_special_tokens: false } })).body.tokens as number[];
    const word = greedy.choices[0]!.message.content!;
    const ban = Object.fromEntries([...(await ids(word)), ...(await ids(` ${word}`))].map((id) => [String(id), -100]));
    const banned = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 1, temperature: 0, logit_bias: ban });
    expect(banned.choices[0]!.message.content).not.toBe(word);
    const t = (await call('inference', 'POST', '/tokenize', { key, body: { model: CHAT, prompt: ' lamp', add_special_tokens: false } })).body.tokens.at(-1);
    const forced = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 3, temperature: 1, seed: 7, logit_bias: { [String(t)]: 100 } });
    const text = (await call('inference', 'POST', '/detokenize', { key, body: { model: CHAT, tokens: [t, t, t] } })).body.prompt;
    expect(forced.choices[0]!.message.content!.trim()).toBe(text.trim());
  });

  it('top_k 1 samples the greedy token whatever the seed', async () => {
    const { openai } = await client();
    const greedy = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 8, temperature: 0 });
    for (const seed of [1, 2]) {
      const r = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 8, temperature: 1.5, seed, top_k: 1 } as never);
      expect((r as OpenAI.ChatCompletion).choices[0]!.message.content).toBe(greedy.choices[0]!.message.content);
    }
  });
});

describe('tokenize and detokenize (vLLM shapes)', () => {
  it('counts a prompt and a conversation the way chat bills them, and decodes back', async () => {
    const { openai, key } = await client();
    const t = await call('inference', 'POST', '/tokenize', { key, body: { model: CHAT, prompt: 'Once upon a time', add_special_tokens: false, return_token_strs: true } });
    expect(t.status).toBe(200);
    expect(t.body).toMatchObject({ count: t.body.tokens.length, max_model_len: expect.any(Number) });
    expect(t.body.token_strs).toHaveLength(t.body.count);
    const d = await call('inference', 'POST', '/detokenize', { key, body: { model: CHAT, tokens: t.body.tokens } });
    expect(d.body.prompt).toBe('Once upon a time');
    const c = await call('inference', 'POST', '/tokenize', { key, body: { model: CHAT, messages: msgs } });
    const r = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 1 });
    expect(c.body.count).toBe(r.usage!.prompt_tokens);
    expect(c.body.token_strs).toBeNull();
    const bad = await call('inference', 'POST', '/detokenize', { key, body: { model: CHAT, tokens: [1, 10_000_000] } });
    expect(bad.status).toBe(400);
    expect(bad.body.error.param).toBe('tokens.1');
    const missing = await call('inference', 'POST', '/tokenize', { key, body: { model: 'no/such', prompt: 'x' } });
    expect(missing.status).toBe(404);
  });
});

describe('CORS', () => {
  it('answers preflights and tags answers for listed origins only', async () => {
    const d = await startDaemon({ CORS_ORIGINS: 'https://app.example.com' });
    try {
      const pre = await fetch(`${d.inferenceUrl}/v1/chat/completions`, {
        method: 'OPTIONS',
        headers: { origin: 'https://app.example.com', 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
      });
      expect(pre.status).toBe(204);
      expect(pre.headers.get('access-control-allow-origin')).toBe('https://app.example.com');
      expect(pre.headers.get('access-control-allow-headers')).toBe('authorization, content-type');
      const other = await fetch(`${d.inferenceUrl}/v1/models`, { headers: { origin: 'https://evil.example.com', authorization: `Bearer ${d.adminKey}` } });
      expect(other.headers.get('access-control-allow-origin')).toBeNull();
      const ok = await fetch(`${d.inferenceUrl}/v1/models`, { headers: { origin: 'https://app.example.com', authorization: `Bearer ${d.adminKey}` } });
      expect(ok.headers.get('access-control-allow-origin')).toBe('https://app.example.com');
      expect(ok.headers.get('access-control-expose-headers')).toContain('x-request-id');
    } finally {
      await stopDaemon(d);
    }
  });
});
