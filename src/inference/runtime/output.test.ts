import { describe, expect, it } from 'vitest';
import type { GenerateEvent } from '../engine-api.js';
import { EventStream } from './output.js';

// The engine port's event stream, without a scheduler: a queue, the wake a waiting read sets,
// and the scheduler's two hooks counted.
function stream() {
  const gen: { queue: GenerateEvent[]; wake: (() => void) | undefined } = { queue: [], wake: undefined };
  const calls = { take: 0, close: 0 };
  const s = new EventStream(
    gen,
    () => (calls.take++, gen.queue.shift()!),
    () => void calls.close++,
  );
  // What Generation.accept / end and turns.ts wakeReader do: queue, then wake a waiting reader.
  const push = (ev: GenerateEvent) => (gen.queue.push(ev), gen.wake?.());
  return { gen, calls, s, push };
}
const delta = (text: string): GenerateEvent => ({ type: 'delta', text, tokenIds: [1] });
const done: GenerateEvent = { type: 'done', finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 2 } };

describe('EventStream', () => {
  it('reads queued events in order, ends after the done event, and closes once then', async () => {
    const { s, calls, push } = stream();
    push(delta('a'));
    push(delta('b'));
    push(done);
    const seen: GenerateEvent[] = [];
    for await (const ev of s) seen.push(ev);
    expect(seen.map((e) => (e.type === 'delta' ? e.text : e.type))).toEqual(['a', 'b', 'done']);
    expect(calls.close).toBe(1);
    expect(await s.next()).toEqual({ value: undefined, done: true });
    await s.return();
    expect(calls.close).toBe(1);
  });

  it('answers a read that waits once an event comes, and keeps it waiting through a wake with nothing queued', async () => {
    const { s, gen, push } = stream();
    const read = s.next();
    expect(gen.wake).toBeTypeOf('function');
    gen.wake!(); // a wake with an empty queue
    let answered = false;
    void read.then(() => (answered = true));
    await Promise.resolve();
    await Promise.resolve();
    expect(answered).toBe(false);
    push(delta('x'));
    expect(await read).toEqual({ value: delta('x'), done: false });
    expect(gen.wake).toBeUndefined();
  });

  it('answers two reads made at once in order', async () => {
    const { s, push } = stream();
    const first = s.next();
    const second = s.next();
    push(delta('1'));
    push(delta('2'));
    expect((await first).value).toEqual(delta('1'));
    expect((await second).value).toEqual(delta('2'));
  });

  it('closes (cancels) when the reader stops before its first read, and ends a read that was waiting', async () => {
    const early = stream();
    expect(await early.s.return()).toEqual({ value: undefined, done: true });
    expect(early.calls.close).toBe(1);
    expect(await early.s.next()).toEqual({ value: undefined, done: true });
    expect(early.calls.take).toBe(0);

    const waiting = stream();
    const read = waiting.s.next();
    await waiting.s.return();
    expect(await read).toEqual({ value: undefined, done: true });
    expect(waiting.calls.close).toBe(1);
    waiting.push(delta('late')); // the generation's last words after the reader left are never taken
    expect(await waiting.s.next()).toEqual({ value: undefined, done: true });
    expect(waiting.calls.take).toBe(0);
  });

  it('throw closes it and rejects with the error given', async () => {
    const { s, calls } = stream();
    await expect(s.throw(new Error('stop'))).rejects.toThrow('stop');
    expect(calls.close).toBe(1);
  });
});

describe('EventStream when a read fails', () => {
  it('rejects the read, whether the event was queued or awaited, and never throws at its caller or its waker', async () => {
    const gen: { queue: GenerateEvent[]; wake: (() => void) | undefined } = { queue: [delta('a')], wake: undefined };
    const s = new EventStream(gen, () => { throw new Error('take failed'); }, () => undefined);
    await expect(s.next()).rejects.toThrow('take failed');
    gen.queue.length = 0;
    const read = s.next();
    gen.queue.push(delta('b'));
    expect(() => gen.wake!()).not.toThrow();
    await expect(read).rejects.toThrow('take failed');
  });
});
