import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { findStories260k } from '../src/inference/convert/default-models.js';
import { parseCheckpoint } from '../src/inference/convert/llama2c.js';
import { refGreedy } from '../src/inference/convert/reference.js';
import { ModelText } from '../src/inference/runtime/text.js';
import { repoRoot } from './daemon.js';
import { daemon, fund, newUser } from './helpers.js';

// The converted stories260K, served by the daemon, must decode greedily exactly
// as llama2.c's own forward pass does (ported in reference.ts).

const shared = findStories260k();
describe.skipIf(!shared)('converter fidelity through the daemon (stories260K)', () => {
  it('matches the llama2.c reference forward pass token for token', async () => {
    const ck = parseCheckpoint(new Uint8Array(fs.readFileSync(path.join(shared!, 'stories260K.bin'))));
    const text = new ModelText(path.join(repoRoot, 'models', 'stories260k'));
    const u = await newUser(['inference:use']);
    await fund(u.userId, 100_000);
    const openai = new OpenAI({ baseURL: `${daemon().inferenceUrl}/api/v1`, apiKey: u.key, maxRetries: 0 });
    for (const content of ['Once upon a time', 'Lily and Ben went to the beach.']) {
      const prompt = await text.encodeChat([{ role: 'user', content }]);
      const N = 40;
      const ref = refGreedy(ck, prompt, N);
      const r = await openai.chat.completions.create({ model: 'cloudgate/stories260k', messages: [{ role: 'user', content }], max_tokens: N, temperature: 0 });
      expect(r.usage!.prompt_tokens).toBe(prompt.length);
      const eos = ref.indexOf(2);
      const expected = eos >= 0 ? ref.slice(0, eos) : ref;
      expect(r.choices[0]!.message.content).toBe(text.decode([...prompt.slice(-4), ...expected]).slice(text.decode(prompt.slice(-4)).length));
      expect(r.usage!.completion_tokens).toBe(eos >= 0 ? eos + 1 : N);
    }
  });
});
