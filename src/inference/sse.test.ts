import { describe, expect, it } from 'vitest';
import type { Ctx } from '../http/context.js';
import { jsonWithText, SseStream } from './sse.js';

/** A response whose writes are recorded; `stall` makes the next write wait until `drain` (a slow reader). */
function fakeCtx() {
  const writes: string[] = [];
  let stalled: ((ok: boolean) => void) | undefined;
  let stallNext = false;
  const ctx = {
    aborted: false,
    ended: false,
    write(chunk: string): Promise<boolean> {
      writes.push(chunk);
      if (!stallNext) return Promise.resolve(!ctx.aborted);
      stallNext = false;
      return new Promise<boolean>((r) => (stalled = r));
    },
    endStream() {
      ctx.ended = true;
    },
  };
  return {
    ctx,
    sse: new SseStream(ctx as unknown as Ctx),
    writes,
    stall: () => (stallNext = true),
    drain: (ok = true) => stalled?.(ok),
  };
}
const turn = () => new Promise((r) => setImmediate(r));

describe('SseStream', () => {
  it('writes the events of one turn in one write, in order, and the next turn in another', async () => {
    const f = fakeCtx();
    expect(await f.sse.send({ n: 1 })).toBe(true);
    expect(await f.sse.send({ n: 2 })).toBe(true);
    await turn();
    await f.sse.send({ n: 3 });
    await turn();
    expect(f.writes).toEqual(['data: {"n":1}\n\ndata: {"n":2}\n\n', 'data: {"n":3}\n\n']);
  });

  it('holds senders while a write waits on the reader, and writes the next frames after it, in order', async () => {
    const f = fakeCtx();
    f.stall();
    await f.sse.send({ n: 1 });
    await turn(); // the first write now waits on the reader
    let resolved = false;
    const second = f.sse.send({ n: 2 }).then((ok) => ((resolved = true), ok));
    await turn();
    await turn();
    expect(resolved).toBe(false);
    expect(f.writes).toEqual(['data: {"n":1}\n\n']);
    f.drain();
    expect(await second).toBe(true);
    await turn();
    expect(f.writes).toEqual(['data: {"n":1}\n\n', 'data: {"n":2}\n\n']);
  });

  it('ends with what is held and [DONE] in one write', async () => {
    const f = fakeCtx();
    await f.sse.send({ n: 1 });
    await f.sse.done();
    await turn();
    expect(f.writes).toEqual(['data: {"n":1}\n\ndata: [DONE]\n\n']);
    expect(f.ctx.ended).toBe(true);
  });

  it('answers false once the client is gone', async () => {
    const f = fakeCtx();
    f.stall();
    await f.sse.send({ n: 1 });
    await turn();
    const next = f.sse.send({ n: 2 });
    f.ctx.aborted = true;
    f.drain(false);
    expect(await next).toBe(false);
    expect(await f.sse.send({ n: 3 })).toBe(false);
  });
});

describe('jsonWithText', () => {
  const chunk = (text: string) => ({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm/x', system_fingerprint: null, choices: [{ index: 0, delta: { content: text }, finish_reason: null, logprobs: null }], usage: null });

  it("writes what JSON.stringify writes, for any text: quotes, escapes, control characters, lone surrogates, the template's own mark", () => {
    const json = jsonWithText(chunk);
    const texts = ['', 'Once', ' upon "a" time\\', '\n\t\u0000\u001f\u007f', '\ud83d\ude00 é 漢', '\ud800', 'x\udc00y', '\u2028\u2029', '\u0000cloudgate-text\u0000', '</script>'];
    for (let i = 0; i < 2000; i++) texts.push(String.fromCharCode(...Array.from({ length: 1 + (i % 7) }, (_, k) => (i * 7919 + k * 104729) % 0x10000)));
    for (const t of texts) expect(json(t)).toBe(JSON.stringify(chunk(t)));
  });

  it('falls back to JSON.stringify where the template holds its mark twice, or not as a string', () => {
    const twice = (t: string) => ({ a: t, b: t });
    expect(jsonWithText(twice)('q"')).toBe(JSON.stringify(twice('q"')));
    const hidden = (t: string) => ({ n: t.length });
    expect(jsonWithText(hidden)('abc')).toBe(JSON.stringify(hidden('abc')));
  });
});
