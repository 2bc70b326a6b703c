import { log } from '../../log.js';
import { wakeReader } from '../../turns.js';
import type { EngineFailure, GenerateEvent, GenerateRequest, TokenLogprob, TokenUsage } from '../engine-api.js';
import { engineMetrics as M, observeFinished } from './metrics.js';
import { endsGeneration } from './protocol.js';
import { Detokenizer, StopMatcher, type ModelText } from './text.js';

/**
 * One generation's output side, kept apart from the batching as vLLM keeps its output
 * processor apart from its scheduler: the tokens the worker sampled become text
 * (detokenised, stop strings held back) and events for the reader, with the request's
 * timings, and at the end, once, its usage for billing. The scheduler decides when the
 * sequence runs; this decides what its reader sees.
 */
export class Generation {
  /** The sampler's seed; the worker samples the sequence from its last prompt chunk on. */
  readonly seed: number;
  private readonly detok: Detokenizer;
  private readonly stop: StopMatcher;
  /** Tokens made (what is billed as output). */
  produced = 0;
  /** Events made and not yet read. */
  readonly queue: GenerateEvent[] = [];
  /** Set while its reader waits for an event (scheduler.ts events); woken a few a turn of the loop (turns.ts wakeReader). */
  wake: (() => void) | undefined;
  finished = false;
  readonly enqueuedAt = performance.now();
  private lastTokenAt = this.enqueuedAt;
  /** When it took a batch slot, and made its first token (request-level metrics). */
  scheduledAt: number | undefined;
  private firstTokenAt: number | undefined;

  constructor(
    readonly req: GenerateRequest,
    private readonly text: ModelText,
    private readonly modelId: string,
  ) {
    this.seed = req.seed ?? (Math.random() * 2 ** 32) >>> 0;
    // The last prompt tokens give the first generated token its context (a leading space, say).
    this.detok = new Detokenizer(text, req.promptTokens.slice(-4));
    this.stop = new StopMatcher(req.stop);
  }

  /**
   * Counts a token the worker sampled and turns it into events. `goesOn`: the sequence
   * continues from it (it ended neither by itself nor by a stop string); `finish`: how it
   * ended here, for the scheduler to end it with. `now`: when the worker sampled it (a decode
   * run posts a few fast steps together), on this thread's performance.now() clock.
   */
  accept(tok: number, lp: TokenLogprob | undefined, now = performance.now()): { goesOn: boolean; finish?: 'stop' | 'length' } {
    if (this.produced === 0) {
      M.ttft.observe({ model: this.modelId }, (now - this.enqueuedAt) / 1000);
      this.firstTokenAt = now;
    } else M.itl.observe(this.modelId, (now - this.lastTokenAt) / 1000);
    this.lastTokenAt = now;
    this.produced++;
    M.generatedTokens.inc(this.modelId);
    const endsHere = endsGeneration(tok, this.produced, this.req.maxTokens, this.text.eosIds);
    if (this.finished) return { goesOn: !endsHere };
    const eos = this.text.eosIds.has(tok);
    let finish: 'stop' | 'length' | undefined;
    if (eos) finish = 'stop';
    else {
      const { out, stopped } = this.stop.push(this.detok.push(tok));
      // A token whose text is held back (a possible stop string) still reports its logprob, with no text.
      if (out || !stopped) this.queue.push(lp ? { type: 'delta', text: out, tokenIds: [tok], logprobs: [lp] } : { type: 'delta', text: out, tokenIds: [tok] });
      if (stopped) finish = 'stop';
      else if (endsHere) finish = 'length';
    }
    if (finish && (finish === 'length' || eos)) {
      const rest = this.stop.flush();
      if (rest) this.queue.push({ type: 'delta', text: rest, tokenIds: [] });
    }
    if (!finish) wakeReader(this);
    return { goesOn: !endsHere, finish };
  }

  /** Ends it once: the final event for its reader, the request's metrics, and its usage for billing. */
  end(finishReason: 'stop' | 'length' | 'cancelled' | 'failed', usage: TokenUsage, failure?: EngineFailure): boolean {
    if (this.finished) return false;
    this.finished = true;
    this.queue.push({ type: 'done', finishReason, usage, ...(failure ? { failure } : {}) });
    observeFinished(this.modelId, {
      enqueuedAt: this.enqueuedAt,
      scheduledAt: this.scheduledAt,
      firstTokenAt: this.firstTokenAt,
      endedAt: performance.now(),
      promptTokens: usage.inputTokens,
      completionTokens: usage.outputTokens,
      finishReason,
    });
    wakeReader(this);
    try {
      this.req.onEnd?.(usage);
    } catch (e) {
      log.error({ err: e }, 'onEnd callback failed');
    }
    return true;
  }
}

const DONE: IteratorResult<GenerateEvent, undefined> = { value: undefined, done: true };
const ENDED = Promise.resolve(DONE);

/**
 * A generation's events for its reader, one a read: the engine port's AsyncGenerator, written
 * out rather than as an async generator function. A generator's `yield` queues a request,
 * awaits the value and settles a promise a read, ~400 B of garbage an event on the HTTP
 * thread; this settles one promise with one result, and a read that waits is woken by a
 * function made once a stream (bench/README.md "Per-token metrics without garbage").
 * `take` reads the queue's first event (the scheduler resumes a sequence paused for its reader
 * there); `close` runs once, when the last event is read or the reader stops early (`return`),
 * as a generator's `finally` would.
 */
export class EventStream implements AsyncGenerator<GenerateEvent, undefined> {
  private ended = false;
  /** A read waiting for the next event (a second read meanwhile waits behind it, as a generator's would), and its answer. */
  private waiting: Promise<IteratorResult<GenerateEvent, undefined>> | undefined;
  private answer: ((r: IteratorResult<GenerateEvent, undefined>) => void) | undefined;
  private fail: ((e: unknown) => void) | undefined;

  constructor(
    /** Its events not yet read, and the wake a waiting read sets (turns.ts wakeReader calls it). */
    private readonly gen: Pick<Generation, 'queue' | 'wake'>,
    private readonly take: () => GenerateEvent,
    private readonly close: () => void,
  ) {}

  next(): Promise<IteratorResult<GenerateEvent, undefined>> {
    if (this.ended) return ENDED;
    if (this.waiting) return this.waiting.then(() => this.next());
    if (this.gen.queue.length) {
      // A read that fails rejects, as a generator's would, rather than throwing at the caller.
      try {
        return Promise.resolve(this.read());
      } catch (e) {
        return Promise.reject(e);
      }
    }
    return (this.waiting = new Promise((resolve, reject) => {
      this.answer = resolve;
      this.fail = reject;
      this.gen.wake = this.woken;
    }));
  }

  /** The reader stops: the generation, if still running, is cancelled (`close`); a read still waiting ends. */
  return(): Promise<IteratorResult<GenerateEvent, undefined>> {
    this.end();
    this.woken();
    return ENDED;
  }

  throw(e?: unknown): Promise<IteratorResult<GenerateEvent, undefined>> {
    this.return();
    return Promise.reject(e);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  private read(): IteratorResult<GenerateEvent, undefined> {
    const ev = this.take();
    if (ev.type === 'done') this.end();
    return { value: ev, done: false };
  }

  /**
   * Answers the waiting read, if any, once there is an event or the stream ended. It runs in the
   * waker's loop over many readers (turns.ts wakeReader): a read that fails rejects the read, and
   * never throws there.
   */
  private readonly woken = (): void => {
    const [answer, fail] = [this.answer, this.fail];
    if (!answer || !fail || (!this.ended && !this.gen.queue.length)) return;
    this.gen.wake = undefined;
    this.waiting = undefined;
    this.answer = this.fail = undefined;
    try {
      answer(this.ended ? DONE : this.read());
    } catch (e) {
      fail(e);
    }
  };

  private end(): void {
    if (this.ended) return;
    this.ended = true;
    this.close();
  }
}
