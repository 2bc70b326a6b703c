import { createGateway } from '@ai-sdk/gateway';
import { experimental_evaluate as evaluate } from 'ai';
import { describe, expect, it } from 'vitest';
import { call, daemon, fund, newUser } from './helpers.js';

// The AI SDK gateway client (ai@7.0.127, @ai-sdk/gateway@4.0.103) is the judge:
// it validates every answer (types, complete distributions, score = weighted mean).

const EVAL = 'cloudgate/random-llama-eval';

async function sdk() {
  const u = await newUser(['inference:use', 'billing:read']);
  await fund(u.userId, 1_000_000);
  const gateway = createGateway({ baseURL: `${daemon().inferenceUrl}/v4/ai`, apiKey: u.key });
  return { ...u, gateway };
}

const questions = {
  happy: { type: 'boolean' as const, instructions: 'Is the character happy?', criteria: { true: 'happy', false: 'not happy' } },
  mood: { type: 'choice' as const, instructions: 'What is the mood?', criteria: { joyful: 'cheerful', sad: null, angry: 'cross', 'very.calm': 'calm and still' } },
  quality: { type: 'score' as const, instructions: 'How well written is it?', criteria: ['poor', 'fair', 'good', 'excellent'] },
};

/** The evaluation model's prefix-cache hits so far (tokens), from /metrics. */
async function hits(): Promise<number> {
  const m = await call('inference', 'GET', '/metrics');
  const line = (m.body as string).split('\n').find((l) => l.startsWith('vllm:prefix_cache_hits_total{') && l.includes(`model_name="${EVAL}"`));
  return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : 0;
}

describe('evaluations through the AI SDK gateway client', () => {
  it('accepts answers of every type', async () => {
    const { gateway } = await sdk();
    const r = await evaluate({ model: gateway.evaluationModel(EVAL), state: { story: 'Lily went to the park and smiled.' }, questions, maxRetries: 0 });
    expect(Object.keys(r.answers).sort()).toEqual(['happy', 'mood', 'quality']);
    expect(r.answers.happy).toMatchObject({ type: 'boolean', probability: expect.any(Number) });
    expect(r.answers.mood!.type).toBe('choice');
    expect(r.answers.quality!.type).toBe('score');
    expect(r.usage.inputTokens).toBeGreaterThan(0);
    expect(r.usage.outputTokens).toBe(0);
  });

  it('answers the same request the same way twice, and the same way when batched with others', async () => {
    const { key } = await sdk();
    const body = { model: EVAL, state: 'The cat sat on the mat.', questions };
    const a = await call('inference', 'POST', '/api/v1/evaluations', { key, body });
    expect(a.status).toBe(200);
    expect(a.headers.get('x-inference-id')).toMatch(/^eval-/);
    const b = await call('inference', 'POST', '/api/v1/evaluations', { key, body });
    // Equal up to float rounding: other test files may share the batch, and a batch's shape changes the
    // summation order of the matrix kernels in the last bits.
    const same = (x: any, y: any) => {
      for (const id of Object.keys(questions)) {
        expect(y[id].type).toBe(x[id].type);
        if (x[id].type === 'boolean') expect(y[id].probability).toBeCloseTo(x[id].probability, 5);
        else for (const k of Object.keys(x[id].probabilities)) expect(y[id].probabilities[k]).toBeCloseTo(x[id].probabilities[k], 5);
        if (x[id].type === 'choice') expect(y[id].choice).toBe(x[id].choice);
      }
    };
    same(a.body.answers, b.body.answers);
    const others = Array.from({ length: 6 }, (_, i) =>
      call('inference', 'POST', '/api/v1/evaluations', { key, body: { ...body, state: `other state ${i} `.repeat(i + 1) } }),
    );
    const [c] = await Promise.all([call('inference', 'POST', '/api/v1/evaluations', { key, body }), ...others]);
    same(a.body.answers, c!.body.answers);
  });

  it("shares one state's prefill among a user's concurrent requests, each billed as if alone", async () => {
    const { key } = await sdk();
    // A state of ~440 tokens (the model reads 512), so that requests sent together arrive while it prefills.
    const body = { model: EVAL, state: `A state shared by the burst ${Date.now()}: ${'the tide came in over the rocks and went out again. '.repeat(12)}`, questions: { q: { type: 'boolean', instructions: 'Is the tide in?' } } };
    const before = await hits();
    let rs: Awaited<ReturnType<typeof call>>[] = [];
    // One burst nearly always shares; a second stands in should a slow machine have run the first one by one.
    for (let burst = 0; burst < 2 && (await hits()) === before; burst++) rs = await Promise.all(Array.from({ length: 16 }, () => call('inference', 'POST', '/api/v1/evaluations', { key, body })));
    expect(await hits()).toBeGreaterThan(before);
    for (const r of rs) {
      expect(r.status).toBe(200);
      expect(r.body.usage).toEqual(rs[0]!.body.usage);
      expect(r.body.answers.q.probability).toBeCloseTo(rs[0]!.body.answers.q.probability, 5);
    }
  });

  it("keeps a user's state for their next request on it (EVAL_PREFIX_CACHE_MB): the same answers and usage, the state not run again", async () => {
    const { key } = await sdk();
    const body = { model: EVAL, state: `A state asked about twice ${Date.now()}: the lamp was lit and the room was warm.`, questions: { q: { type: 'boolean', instructions: 'Is the room warm?' } } };
    const first = await call('inference', 'POST', '/api/v1/evaluations', { key, body });
    const before = await hits();
    const second = await call('inference', 'POST', '/api/v1/evaluations', { key, body });
    expect(first.status).toBe(200);
    expect(second.status).toBe(200);
    expect(second.body.usage).toEqual(first.body.usage); // billed as if it ran alone
    expect(second.body.answers.q.probability).toBeCloseTo(first.body.answers.q.probability, 5);
    // At least the state's tokens were found kept (other files' requests may add to the counter).
    expect((await hits()) - before).toBeGreaterThanOrEqual(10);
  });

  it('takes the model from ai-model-id on the gateway path and refuses a chat model with invalid_model', async () => {
    const { key } = await sdk();
    const ok = await call('inference', 'POST', '/v4/ai/evaluation-model', {
      key,
      body: { state: 'x', questions: { q: { type: 'boolean' } } },
      headers: { 'ai-model-id': EVAL, 'ai-evaluation-model-specification-version': '4' },
    });
    expect(ok.status).toBe(200);
    expect(ok.body.warnings).toEqual([]);
    const chat = await call('inference', 'POST', '/api/v1/evaluations', { key, body: { model: 'cloudgate/random-llama-chat', state: 'x', questions: { q: { type: 'boolean' } } } });
    expect(chat.status).toBe(400);
    expect(chat.body.error.code).toBe('invalid_model');
    expect(chat.headers.get('x-inference-id')).toMatch(/^eval-/);
    const none = await call('inference', 'POST', '/v4/ai/evaluation-model', { key, body: { state: 'x', questions: { q: { type: 'boolean' } } } });
    expect(none.status).toBe(400);
    expect(none.body.error.param).toBe('model');
  });

  it('warns with the SDK unsupported shape when images reach a text-only model', async () => {
    const { key } = await sdk();
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0]).toString('base64');
    const r = await call('inference', 'POST', '/api/v1/evaluations', {
      key,
      body: { model: EVAL, state: 'x', questions: { q: { type: 'boolean' } }, images: [`data:image/png;base64,${png}`] },
    });
    expect(r.status).toBe(200);
    expect(r.body.warnings[0]).toMatchObject({ type: 'unsupported', feature: 'images' });
  });

  it('answers 64 questions and refuses 65, naming the field', async () => {
    const { key } = await sdk();
    const qs = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`q${i}`, { type: 'boolean', instructions: `Question number ${i}?` }]));
    const ok = await call('inference', 'POST', '/api/v1/evaluations', { key, body: { model: EVAL, state: 'x', questions: qs(64) } });
    expect(ok.status).toBe(200);
    expect(Object.keys(ok.body.answers)).toHaveLength(64);
    const no = await call('inference', 'POST', '/api/v1/evaluations', { key, body: { model: EVAL, state: 'x', questions: qs(65) } });
    expect(no.status).toBe(400);
    expect(no.body.error).toMatchObject({ type: 'invalid_request_error', param: 'questions' });
  });

  it('answers 413 for a body over 16 MiB', async () => {
    const { key } = await sdk();
    const r = await call('inference', 'POST', '/api/v1/evaluations', { key, raw: Buffer.alloc(16 * 1024 * 1024 + 1, 0x20), headers: { 'content-type': 'application/json' } });
    expect(r.status).toBe(413);
  });
});
