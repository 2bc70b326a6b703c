import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { call, daemon, fund, newUser } from './helpers.js';

// The openai npm SDK is the client: what works here works for applications.

const CHAT = 'cloudgate/random-llama-chat';
const EVAL = 'cloudgate/random-llama-eval';

async function client(opts: { rateLimits?: Record<string, number>; funded?: boolean } = {}) {
  const u = await newUser(['inference:use', 'billing:read'], opts.rateLimits);
  if (opts.funded !== false) await fund(u.userId, 100_000);
  const openai = new OpenAI({ baseURL: `${daemon().inferenceUrl}/api/v1`, apiKey: u.key, maxRetries: 0 });
  return { ...u, openai };
}

async function metric(name: string, labels: string): Promise<number> {
  const m = await call('inference', 'GET', '/metrics');
  const line = (m.body as string).split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : 0;
}

describe('models', () => {
  it('lists chat and evaluation models and retrieves ids with a slash, raw or encoded', async () => {
    const { openai, key } = await client();
    const list = await openai.models.list();
    const ids = list.data.map((m) => m.id);
    expect(ids).toContain(CHAT);
    expect(ids).toContain(EVAL);
    for (const m of list.data) expect(m).toMatchObject({ object: 'model', owned_by: expect.any(String), created: expect.any(Number) });
    const one = await openai.models.retrieve(CHAT);
    expect(one.id).toBe(CHAT);
    const enc = await call('inference', 'GET', `/api/v1/models/${encodeURIComponent(CHAT)}`, { key });
    expect(enc.body.id).toBe(CHAT);
    const missing = await call('inference', 'GET', '/api/v1/models/no/such', { key });
    expect(missing.status).toBe(404);
    expect(missing.body.error.code).toBe('model_not_found');
  });
});

describe('chat completions', () => {
  it('answers a non-streamed completion with usage and finish_reason length at max_tokens', async () => {
    const { openai } = await client();
    const r = await openai.chat.completions.create({ model: CHAT, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 8, temperature: 0 });
    expect(r.object).toBe('chat.completion');
    expect(r.choices[0]!.message.role).toBe('assistant');
    expect(r.usage!.completion_tokens).toBeLessThanOrEqual(8);
    expect(r.usage!.total_tokens).toBe(r.usage!.prompt_tokens + r.usage!.completion_tokens);
    // Either the model ended the text early (stop) or max_tokens cut it: each says so exactly.
    expect(['stop', 'length']).toContain(r.choices[0]!.finish_reason);
    expect(r.usage!.completion_tokens === 8).toBe(r.choices[0]!.finish_reason === 'length');
  });

  it('streams: role first, content deltas, a finish chunk and a usage chunk, and the same text as non-streamed at temperature 0', async () => {
    const { openai } = await client();
    const body = { model: CHAT, messages: [{ role: 'user' as const, content: 'Tell me a story' }], max_tokens: 12, temperature: 0 };
    const whole = await openai.chat.completions.create(body);
    const stream = await openai.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    const finish = chunks.find((c) => c.choices[0]?.finish_reason);
    expect(finish).toBeDefined();
    const last = chunks[chunks.length - 1]!;
    expect(last.choices).toEqual([]);
    // The same user's same prompt again: it starts from the first's kept cache, all but its last token (runtime/kept-prompts.ts), billed all the same.
    expect(last.usage).toEqual({ ...whole.usage, prompt_tokens_details: { cached_tokens: whole.usage!.prompt_tokens - 1 } });
    expect(whole.usage!.prompt_tokens_details).toEqual({ cached_tokens: 0 });
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
    expect(text).toBe(whole.choices[0]!.message.content);
  });

  it("starts a conversation's next turn from the same user's kept one (prompt_tokens_details.cached_tokens), never from another user's", async () => {
    const [a, b] = [await client(), await client()];
    const turn1 = [{ role: 'system' as const, content: 'You tell short stories about a dog named Max and his red ball in the park.' }, { role: 'user' as const, content: 'Begin.' }];
    const first = await a.openai.chat.completions.create({ model: CHAT, messages: turn1, max_tokens: 10, temperature: 0 });
    const turn2 = [...turn1, { role: 'assistant' as const, content: first.choices[0]!.message.content! }, { role: 'user' as const, content: 'Go on.' }];
    const hits0 = await metric('vllm:prefix_cache_hits_total', `model_name="${CHAT}"`);
    const second = await a.openai.chat.completions.create({ model: CHAT, messages: turn2, max_tokens: 10, temperature: 0 });
    const cached = second.usage!.prompt_tokens_details!.cached_tokens!;
    // At least the first turn's prompt (the answer's text may not tokenize back to the tokens that made it), billed whole.
    expect(cached).toBeGreaterThanOrEqual(first.usage!.prompt_tokens);
    expect(cached).toBeLessThan(second.usage!.prompt_tokens);
    expect((await metric('vllm:prefix_cache_hits_total', `model_name="${CHAT}"`)) - hits0).toBe(cached);
    const other = await b.openai.chat.completions.create({ model: CHAT, messages: turn2, max_tokens: 10, temperature: 0 });
    expect(other.usage).toMatchObject({ prompt_tokens: second.usage!.prompt_tokens, prompt_tokens_details: { cached_tokens: 0 } });
    // llama.cpp server's cache_prompt: false runs the whole prompt; a value of another type is refused, naming the field.
    const whole = await a.openai.chat.completions.create({ model: CHAT, messages: turn2, max_tokens: 10, temperature: 0, cache_prompt: false } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(whole.usage!.prompt_tokens_details).toEqual({ cached_tokens: 0 });
    const bad = await call('inference', 'POST', '/api/v1/chat/completions', { key: a.key, body: { model: CHAT, messages: turn2, max_tokens: 2, cache_prompt: 'yes' } });
    expect(bad.status).toBe(400);
    expect(bad.body.error.message).toMatch(/cache_prompt.*must be true or false/);
  });

  it('stops before a stop sequence taken from the middle of the greedy text, never emitting it', async () => {
    const { openai } = await client();
    const body = { model: CHAT, messages: [{ role: 'user' as const, content: 'A B C' }], max_tokens: 24, temperature: 0 };
    const full = (await openai.chat.completions.create(body)).choices[0]!.message.content!;
    expect(full.length).toBeGreaterThan(6);
    const cut = Math.floor(full.length / 2);
    const stop = full.slice(cut, cut + 3);
    const first = full.indexOf(stop);
    const r = await openai.chat.completions.create({ ...body, stop: [stop, 'zzzzqqq'] });
    expect(r.choices[0]!.message.content).toBe(full.slice(0, first));
    expect(r.choices[0]!.finish_reason).toBe('stop');
    const s = await openai.chat.completions.create({ ...body, stop, stream: true });
    let text = '';
    for await (const c of s) text += c.choices[0]?.delta.content ?? '';
    expect(text).toBe(full.slice(0, first));
  });

  it('is reproducible with a seed at temperature 1', async () => {
    const { openai } = await client();
    const body = { model: CHAT, messages: [{ role: 'user' as const, content: 'hello' }], max_tokens: 10, temperature: 1, seed: 42 };
    const a = await openai.chat.completions.create(body);
    const b = await openai.chat.completions.create(body);
    expect(a.choices[0]!.message.content).toBe(b.choices[0]!.message.content);
  });

  it('cancels the sequence when the client aborts mid-stream; the running gauge returns to 0', async () => {
    const { openai } = await client();
    const stream = await openai.chat.completions.create({ model: CHAT, messages: [{ role: 'user', content: 'go on' }], max_tokens: 400, temperature: 1, seed: 7, stream: true });
    let n = 0;
    // Leaving the loop is the SDK's abort: it aborts the request and closes the connection.
    // (abort() from inside the loop can leave the SDK's iterator waiting forever once chunks are buffered.)
    for await (const _ of stream) if (++n === 3) break;
    expect(n).toBe(3);
    let running = 1;
    for (let i = 0; i < 50 && running > 0; i++) {
      await new Promise((r) => setTimeout(r, 50));
      running = await metric('vllm:num_requests_running', `model_name="${CHAT}"`);
    }
    expect(running).toBe(0);
  });

  it('answers every error in the inference body with the SDK error classes', async () => {
    const { openai } = await client();
    const msg = [{ role: 'user' as const, content: 'x' }];
    await expect(openai.chat.completions.create({ model: 'nope/none', messages: msg })).rejects.toMatchObject({ status: 404, code: 'model_not_found' });
    await expect(openai.chat.completions.create({ model: EVAL, messages: msg })).rejects.toMatchObject({ status: 400, code: 'invalid_model', param: 'model' });
    await expect(openai.chat.completions.create({ model: CHAT, messages: msg, temperature: 2.5 })).rejects.toMatchObject({
      status: 400,
      param: 'temperature',
      type: 'invalid_request_error',
    });
    await expect(openai.chat.completions.create({ model: CHAT, messages: [] })).rejects.toMatchObject({ status: 400, param: 'messages' });
    await expect(openai.chat.completions.create({ model: CHAT, messages: [{ role: 'user', content: 'word '.repeat(2000) }] })).rejects.toMatchObject({
      status: 400,
      code: 'context_length_exceeded',
    });
    const bad = new OpenAI({ baseURL: `${daemon().inferenceUrl}/api/v1`, apiKey: 'cg_invalid', maxRetries: 0 });
    await expect(bad.models.list()).rejects.toMatchObject({ status: 401, code: 'invalid_api_key' });
  });
});
