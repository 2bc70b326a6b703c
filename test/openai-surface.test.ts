import fs from 'node:fs';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { generateCheckpoint } from '../src/inference/convert/generate.js';
import { RANDOM_LLAMA_PARAMS } from '../src/inference/convert/default-models.js';
import { RefTransformer } from '../src/inference/convert/reference.js';
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
    ['response_format json_schema without its schema object', { response_format: { type: 'json_schema' } }, 'response_format.json_schema'],
    ['tools without tool_choice ("auto" by default)', { tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }, 'tool_choice'],
    ['tool_choice auto', { tool_choice: 'auto' }, 'tool_choice'],
    ['top_logprobs without logprobs', { top_logprobs: 3 }, 'top_logprobs'],
    ['top_logprobs over 20', { logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
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

describe('logprobs', () => {
  it('reports each token\'s logprob and top_logprobs as a plain forward pass of the same weights computes them, streamed and not', async () => {
    const { openai, key } = await client();
    const prompt = (await call('inference', 'POST', '/tokenize', { key, body: { model: CHAT, messages: msgs } })).body.tokens as number[];
    const K = 5;
    const r = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: K });
    const items = r.choices[0]!.logprobs!.content!;
    expect(items).toHaveLength(6);
    // The reference: llama2.c's forward pass in JavaScript over the checkpoint the model was converted from.
    const ref = new RefTransformer(generateCheckpoint(RANDOM_LLAMA_PARAMS));
    let logits!: Float32Array;
    prompt.forEach((t, pos) => (logits = ref.forward(t, pos)));
    for (let i = 0; i < items.length; i++) {
      const max = Math.max(...logits);
      const lse = max + Math.log(logits.reduce((a, v) => a + Math.exp(v - max), 0));
      const order = [...logits.keys()].sort((a, b) => logits[b]! - logits[a]! || a - b);
      const tok = order[0]!;
      expect(items[i]!.logprob).toBeCloseTo(logits[tok]! - lse, 3);
      expect(items[i]!.top_logprobs).toHaveLength(K);
      items[i]!.top_logprobs.forEach((alt, j) => expect(alt.logprob).toBeCloseTo(logits[order[j]!]! - lse, 3));
      expect(items[i]!.top_logprobs[0]!.token).toBe(items[i]!.token);
      expect(Buffer.from(items[i]!.bytes!).toString('utf8')).toBe(items[i]!.token);
      logits = ref.forward(tok, prompt.length + i);
    }
    expect(items.map((x) => x.token).join('')).toBe(r.choices[0]!.message.content);
    const stream = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: K, stream: true });
    const streamed: number[] = [];
    for await (const c of stream) for (const x of c.choices[0]?.logprobs?.content ?? []) streamed.push(x.logprob);
    // The same, to float32's rounding: the same user's same prompt starts from the first's kept cache and runs its last token alone.
    expect(streamed).toHaveLength(items.length);
    streamed.forEach((lp, i) => expect(lp).toBeCloseTo(items[i]!.logprob, 5));
    const none = await openai.chat.completions.create({ model: CHAT, messages: msgs, max_tokens: 2 });
    expect(none.choices[0]!.logprobs).toBeNull();
  });
});

describe('legacy completions (POST /v1/completions)', () => {
  it('completes a string prompt like chat would complete the same tokens, with usage, stop and echo', async () => {
    const { openai, key } = await client();
    const r = await openai.completions.create({ model: CHAT, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
    expect(r.object).toBe('text_completion');
    expect(r.id).toMatch(/^cmpl-/);
    expect(r.choices[0]!.finish_reason).toBe('length');
    expect(r.usage).toMatchObject({ completion_tokens: 8, total_tokens: r.usage!.prompt_tokens + 8 });
    const ids = (await call('inference', 'POST', '/tokenize', { key, body: { model: CHAT, prompt: 'Once upon a time' } })).body.tokens;
    expect(r.usage!.prompt_tokens).toBe(ids.length);
    // The same prompt as token ids gives the same greedy text.
    const byIds = await openai.completions.create({ model: CHAT, prompt: ids, max_tokens: 8, temperature: 0 });
    expect(byIds.choices[0]!.text).toBe(r.choices[0]!.text);
    const echo = await openai.completions.create({ model: CHAT, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, echo: true });
    expect(echo.choices[0]!.text).toBe('Once upon a time' + r.choices[0]!.text);
    // 16 tokens when max_tokens is absent, as OpenAI's legacy default.
    expect((await openai.completions.create({ model: CHAT, prompt: 'x', temperature: 0 })).usage!.completion_tokens).toBeLessThanOrEqual(16);
  });

  it("starts a prompt that continues the same user's last completion from its kept cache, streamed or not (usage.prompt_tokens_details.cached_tokens)", async () => {
    const { openai } = await client();
    const opening = 'Once upon a time there was a little dog who lived by the sea and loved to run.';
    const first = await openai.completions.create({ model: CHAT, prompt: opening, max_tokens: 6, temperature: 0 });
    expect(first.usage!.prompt_tokens_details).toEqual({ cached_tokens: 0 });
    const next = `${opening}${first.choices[0]!.text} Then`;
    const stream = await openai.completions.create({ model: CHAT, prompt: next, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of stream) usage = c.usage ?? usage;
    expect(usage!.prompt_tokens_details!.cached_tokens).toBeGreaterThanOrEqual(first.usage!.prompt_tokens - 1);
    const whole = await openai.completions.create({ model: CHAT, prompt: next, max_tokens: 6, temperature: 0, cache_prompt: false } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(whole.usage).toMatchObject({ prompt_tokens: usage!.prompt_tokens, prompt_tokens_details: { cached_tokens: 0 } });
  });

  it('answers several prompts as several choices, streamed with include_usage too', async () => {
    const { openai } = await client();
    const prompts = ['Once upon a time', 'The dog'];
    const one = await Promise.all(prompts.map((p) => openai.completions.create({ model: CHAT, prompt: p, max_tokens: 5, temperature: 0 })));
    const r = await openai.completions.create({ model: CHAT, prompt: prompts, max_tokens: 5, temperature: 0 });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(r.choices.map((c) => c.text)).toEqual(one.map((o) => o.choices[0]!.text));
    expect(r.usage!.completion_tokens).toBe(10);
    const stream = await openai.completions.create({ model: CHAT, prompt: prompts, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true } });
    const texts = ['', ''];
    const finishes: string[] = [];
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of stream) {
      for (const ch of c.choices) {
        texts[ch.index] += ch.text;
        if (ch.finish_reason) finishes.push(ch.finish_reason);
      }
      if (c.usage) usage = c.usage;
    }
    expect(texts).toEqual(one.map((o) => o.choices[0]!.text));
    expect(finishes).toEqual(['length', 'length']);
    expect(usage!.total_tokens).toBe(r.usage!.total_tokens);
  });

  it('reports legacy logprobs consistent with chat logprobs of the same tokens', async () => {
    const { openai } = await client();
    const r = await openai.completions.create({ model: CHAT, prompt: 'Once upon a time', max_tokens: 4, temperature: 0, logprobs: 3 });
    const lp = r.choices[0]!.logprobs!;
    expect(lp.tokens).toHaveLength(4);
    expect(lp.tokens!.join('')).toBe(r.choices[0]!.text);
    expect(lp.text_offset).toEqual(lp.tokens!.map((_, i) => lp.tokens!.slice(0, i).join('').length));
    lp.top_logprobs!.forEach((alts, i) => {
      expect(Object.keys(alts).length).toBeGreaterThanOrEqual(1);
      expect(Math.max(...Object.values(alts))).toBeCloseTo(lp.token_logprobs![i]!, 5);
    });
  });

  it('refuses an evaluation model, echo with logprobs, suffix, best_of and bad token ids by name', async () => {
    const { key } = await client();
    const post = (body: Record<string, unknown>) => call('inference', 'POST', '/v1/completions', { key, body: { model: CHAT, prompt: 'hi', max_tokens: 2, ...body } });
    const e = await post({ model: EVAL });
    expect(e.status).toBe(400);
    expect(e.body.error.code).toBe('invalid_model');
    for (const [body, param] of [[{ echo: true, logprobs: 1 }, 'echo'], [{ suffix: 'x' }, 'suffix'], [{ best_of: 2 }, 'best_of'], [{ prompt: [[1, 999999]] }, 'prompt.0.1'], [{ logprobs: 6 }, 'logprobs'], [{ max_tokens: 100000 }, 'max_tokens']] as const) {
      const r = await post(body);
      expect({ param, status: r.status, got: r.body.error.param }).toEqual({ param, status: 400, got: param });
    }
  });
});
