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
    const model = { model: this.modelId };
    if (this.produced === 0) {
      M.ttft.observe(model, (now - this.enqueuedAt) / 1000);
      this.firstTokenAt = now;
    } else M.itl.observe(model, (now - this.lastTokenAt) / 1000);
    this.lastTokenAt = now;
    this.produced++;
    M.generatedTokens.inc(model);
    const endsHere = endsGeneration(tok, this.produced, this.req.maxTokens, this.text.eosIds);
    if (this.finished) return { goesOn: !endsHere };
    const eos = this.text.eosIds.has(tok);
    let finish: 'stop' | 'length' | undefined;
    if (eos) finish = 'stop';
    else {
      const { out, stopped } = this.stop.push(this.detok.push(tok));
      const logprobs = lp ? { logprobs: [lp] } : {};
      // A token whose text is held back (a possible stop string) still reports its logprob, with no text.
      if (out || !stopped) this.queue.push({ type: 'delta', text: out, tokenIds: [tok], ...logprobs });
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
