import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateObject, generateText, jsonSchema, streamObject, tool } from 'ai';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { daemon, fund, newUser } from './helpers.js';

// Issue 15: the AI SDK through its OpenAI-compatible provider, base URL http://host:port/v1:
// objects (whole and streamed) and a required tool, as an application writes them.

const MODEL = 'cloudgate/random-llama-chat';
const Story = z.object({ title: z.string().max(16), pages: z.number().int().min(1).max(40), scary: z.boolean() });

async function provider() {
  const u = await newUser(['inference:use']);
  await fund(u.userId, 1_000_000);
  return createOpenAICompatible({ name: 'cloudgate', baseURL: `${daemon().inferenceUrl}/v1`, apiKey: u.key, supportsStructuredOutputs: true });
}

describe('AI SDK (@ai-sdk/openai-compatible)', () => {
  it('generateObject and streamObject return objects of the schema', async () => {
    const p = await provider();
    for (const seed of [1, 2]) {
      const r = await generateObject({ model: p.chatModel(MODEL), schema: Story, prompt: 'A story.', seed, temperature: 1, maxOutputTokens: 120, maxRetries: 0 });
      expect(Story.safeParse(r.object).success).toBe(true);
    }
    const s = streamObject({ model: p.chatModel(MODEL), schema: Story, prompt: 'A story.', seed: 3, temperature: 1, maxOutputTokens: 120, maxRetries: 0 });
    let partials = 0;
    for await (const _ of s.partialObjectStream) partials++; // the SDK reads the stream only when someone does
    expect(partials).toBeGreaterThan(1);
    expect(Story.safeParse(await s.object).success).toBe(true);
  });

  it('generateText with a required tool gets a call with valid arguments', async () => {
    const p = await provider();
    const r = await generateText({
      model: p.chatModel(MODEL),
      prompt: 'What is the weather?',
      tools: { weather: tool({ description: 'Weather in a city', inputSchema: jsonSchema<{ city: string }>({ type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false }) }) },
      toolChoice: 'required',
      seed: 2,
      maxOutputTokens: 60,
      maxRetries: 0,
    });
    expect(r.toolCalls).toHaveLength(1);
    expect(r.toolCalls[0]!.toolName).toBe('weather');
    expect(typeof (r.toolCalls[0]!.input as { city: string }).city).toBe('string');
    expect(r.finishReason).toBe('tool-calls');
  });
});
