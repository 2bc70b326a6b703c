import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fundedKey, startDaemon, stopDaemon, type Started } from '../daemon.js';

// A second signal exits at once, with code 1. The model workers were mid-step then, and the
// exit used to cut them inside an onnxruntime call: the process died by SIGABRT
// ("terminate called after throwing an instance of 'Napi::Error'"; this test saw it in 1 of 4
// runs of that code). Now each worker ends at the end of its step first (main.ts
// EXIT_NOW_WAIT_MS, Runner.exitNow).

const CHAT = 'cloudgate/random-llama-chat';
// Streams that outlast both signals, with prompts long enough that many of them join the decode
// run at a time: the workers spend most of their time inside onnxruntime's runs.
const LONG = { model: CHAT, messages: [{ role: 'user', content: 'the cat sat on the mat and '.repeat(3) }], max_tokens: 300, temperature: 0, logit_bias: { '2': -100 }, stream: true };
const STREAMS = 48;

let d: Started;
let key: string;
beforeAll(async () => {
  // A long grace: the first signal's shutdown is still waiting on the streams when the second comes.
  d = await startDaemon({ SHUTDOWN_GRACE_MS: '30000', STREAM_TIMEOUT_MS: '60000' });
  key = (await fundedKey(d, 1_000_000, ['inference:use'], { requestsPerMinute: 10_000, tokensPerMinute: 10_000_000 })).key;
}, 60_000);
afterAll(async () => {
  if (d && d.proc.exitCode === null && d.proc.signalCode === null) await stopDaemon(d, 'SIGKILL');
});

describe('a second signal', () => {
  it('exits with code 1 while streams run, not by SIGABRT', async () => {
    const streams = Array.from({ length: STREAMS }, async () => {
      const r = await fetch(`${d.inferenceUrl}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(LONG) });
      return { status: r.status, text: await r.text().catch(() => '') };
    });
    await new Promise((r) => setTimeout(r, 300));
    d.proc.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 100));
    d.proc.kill('SIGTERM');
    const code = await d.exited;
    const ends = await Promise.allSettled(streams);
    expect(ends.map((e) => (e.status === 'fulfilled' ? e.value.status : 0))).toContain(200);
    const log = fs.readFileSync(d.logFile, 'utf8');
    expect(code, `daemon exit; its log's end:\n${log.slice(-3000)}`).toBe(1);
    expect(log).toContain('second signal: exiting now');
  }, 30_000);
});
