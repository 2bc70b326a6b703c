import { Ajv } from 'ajv';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { call, daemon, fund, newUser } from './helpers.js';

// Issue 15.4: structured outputs by constrained decoding, driven by the openai SDK's own helpers.
// The served models are tiny (random weights, and TinyStories when ../shared is there): nothing
// but the grammar makes their output JSON, so a valid document every time is the grammar's doing.

const MODELS = ['cloudgate/random-llama-chat', 'cloudgate/stories260k'];
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), happy: z.boolean(), pets: z.array(z.enum(['cat', 'dog'])).max(2) });

async function client() {
  const u = await newUser(['inference:use']);
  await fund(u.userId, 1_000_000);
  return { ...u, openai: new OpenAI({ baseURL: `${daemon().inferenceUrl}/v1`, apiKey: u.key, maxRetries: 0 }) };
}

async function served(openai: OpenAI): Promise<string[]> {
  const ids = (await openai.models.list()).data.map((m) => m.id);
  return MODELS.filter((m) => ids.includes(m));
}

describe('structured outputs', () => {
  it('answers chat.completions.parse with a document of the zod schema, for every seed and model', async () => {
    const { openai } = await client();
    for (const model of await served(openai)) {
      for (const seed of [1, 2, 3, 4]) {
        const r = await openai.chat.completions.parse({
          model,
          messages: [{ role: 'user', content: 'Describe a person.' }],
          response_format: zodResponseFormat(Person, 'person'),
          max_tokens: 160,
          temperature: 1,
          seed,
        });
        expect({ model, seed, finish: r.choices[0]!.finish_reason }).toEqual({ model, seed, finish: 'stop' });
        expect(Person.safeParse(r.choices[0]!.message.parsed).success).toBe(true);
      }
    }
  });

  it('streams a valid document, and json_object mode answers a JSON object', async () => {
    const { openai } = await client();
    const schema = { type: 'object', properties: { answer: { enum: ['yes', 'no'] }, score: { type: 'integer', minimum: 1, maximum: 5 } }, required: ['answer', 'score'], additionalProperties: false };
    const validate = new Ajv().compile(schema);
    const stream = await openai.chat.completions.create({
      model: MODELS[0]!, messages: [{ role: 'user', content: 'Rate it.' }], max_tokens: 60, temperature: 0.8, seed: 5, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'rating', schema, strict: true } },
    });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta.content ?? '';
    expect(validate(JSON.parse(text))).toBe(true);
    const obj = await openai.chat.completions.create({ model: MODELS[0]!, messages: [{ role: 'user', content: 'Any object.' }], max_tokens: 200, temperature: 0, response_format: { type: 'json_object' } });
    if (obj.choices[0]!.finish_reason === 'stop') expect(typeof JSON.parse(obj.choices[0]!.message.content!)).toBe('object');
    else expect(obj.choices[0]!.finish_reason).toBe('length');
  });

  it('says length when max_tokens cuts the document, and refuses an unsupported keyword by its path', async () => {
    const { openai, key } = await client();
    const cut = await openai.chat.completions.create({ model: MODELS[0]!, messages: [{ role: 'user', content: 'x' }], max_tokens: 2, temperature: 0, response_format: zodResponseFormat(Person, 'person') });
    expect(cut.choices[0]!.finish_reason).toBe('length');
    expect('{"name":"'.startsWith(cut.choices[0]!.message.content!) || cut.choices[0]!.message.content!.startsWith('{')).toBe(true);
    const bad = await call('inference', 'POST', '/v1/chat/completions', {
      key,
      body: { model: MODELS[0], messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { id: { type: 'string', pattern: '^[a-z]+$' } } } } } },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.error.param).toBe('response_format.json_schema.schema.properties.id.pattern');
    expect(bad.body.error.message).toContain('"pattern" is not supported');
  });
});
