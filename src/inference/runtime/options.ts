// Limits of one model's scheduler. Each is a trade named with its unit.

export interface EngineOptions {
  /** Sequences decoding together. 64 keeps a 2-core CPU busy without starving prefill; GPUs want more. */
  batchSizeMax: number;
  /** Requests waiting for a slot before new ones get 429; about 4 batches, a few seconds of work. */
  queueDepthMax: number;
  /**
   * A request is admitted only if it would start within this long, estimated from
   * how fast batch slots have been freeing up or, with too few requests ended lately
   * to tell, from the work ahead of it at face value (throughput.ts); others get 429
   * with the Retry-After the queue implies. 10 s: well inside an SDK's default timeout.
   */
  admissionWaitMsMax: number;
  /** Token positions (rows x padded length) in one prefill step, so a long prompt never stalls running streams for more than a step. */
  prefillTokensPerStepMax: number;
  /**
   * The same bound when no stream is decoding: nothing waits on this step, so
   * larger steps may run, up to where a CPU's attention-bound step grows
   * slower per token (its score tensors no longer stay in cache): 64
   * concurrent evaluations of a 370-token state took 1.3 s at 1024, 1.6 s at
   * 2048 and 2.1 s at 8192 on a 2-core machine. 1024 still takes all 64
   * question branches of a typical evaluation in one step.
   */
  prefillTokensPerIdleStepMax: number;
  /**
   * Decode steps the worker runs on its own before the scheduler looks again. Whatever
   * should change the batch sooner ends a run after its current step anyway (an arrival
   * that cannot join, a cancellation, a reader falling behind: Scheduler.kick), and
   * prompts join a run without ending it, so the bound is only what a run costs when
   * nothing happens: one round trip between the threads, during which the model idles
   * (0.4-1 ms, up to 8 when the main thread is busy). 64 makes a 64-token request one
   * run: at one stream of m25 int4 1.079 and 1.147 of 16's tokens/s (7 of 8 pairs each),
   * at 16 streams 1.036 (bench/README.md "Commands read between two steps").
   */
  decodeRunStepsMax: number;
  /** Generated tokens a stream may hold unread before its sequence pauses (a reader that stopped reading costs no memory growth). */
  pendingTokensMax: number;
  /**
   * Memory for evaluation states kept once their questions have forked from them, so that a
   * later request of the same user on the same state forks its questions from the kept one
   * instead of prefilling it again (Scheduler `kept`), least recently used first out. A kept
   * state costs its keys and values twice over (its cache and the branch graph's copy of it):
   * 24 MB for a 380-token state of m25 (32 KiB a position), so the default keeps about ten of
   * them. 0 keeps none. EVAL_PREFIX_CACHE_MB.
   */
  prefixCacheBytesMax: number;
  /**
   * Memory per chat model (per replica) for finished generations kept so that their user's next
   * prompt opening with the same tokens (a conversation's next turn, the same system prompt)
   * starts from their cache and runs only the rest (kept-prompts.ts), least recently used first
   * out. A kept generation costs its keys and values once: 32 KiB a position at m25, so the
   * default holds ~8,000 positions there, ~1,300 at a 450M model. Taken when the model loads
   * (kept-arena.ts; up to an eighth of the process's memory and 64 of the model's contexts, the
   * rest as it fills), as llama.cpp and vLLM take their caches' memory. 0 keeps none. CHAT_PREFIX_CACHE_MB.
   */
  chatPrefixCacheBytesMax: number;
}

export const defaultEngineOptions: EngineOptions = {
  batchSizeMax: 64,
  queueDepthMax: 256,
  admissionWaitMsMax: 10_000,
  prefillTokensPerStepMax: 512,
  prefillTokensPerIdleStepMax: 1024,
  pendingTokensMax: 256,
  decodeRunStepsMax: 64,
  prefixCacheBytesMax: 256 * 2 ** 20,
  chatPrefixCacheBytesMax: 256 * 2 ** 20,
};

/**
 * `items` in order, cut into groups that each fit one step of `tokensMax` token positions (rows
 * x the longest row, prefillTokensPerStepMax): how prompts that join a decode run together share
 * steps, in the scheduler (one message a group) and in the worker (one step a group of messages).
 * An item alone over the budget still makes a group of its own.
 */
export function inStepBudget<T>(items: readonly T[], rowsOf: (t: T) => number, widthOf: (t: T) => number, tokensMax: number): T[][] {
  const groups: T[][] = [];
  let group: T[] = [];
  let rows = 0;
  let width = 0;
  for (const t of items) {
    if (group.length && (rows + rowsOf(t)) * Math.max(width, widthOf(t)) > tokensMax) {
      groups.push(group);
      group = [];
      rows = 0;
      width = 0;
    }
    group.push(t);
    rows += rowsOf(t);
    width = Math.max(width, widthOf(t));
  }
  if (group.length) groups.push(group);
  return groups;
}
