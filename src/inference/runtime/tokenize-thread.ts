import { JobThread } from './job-thread.js';

/**
 * Texts up to this many characters are tokenised inline: the tokenizer runs at
 * 3-8 µs per character here (10,000 characters took 26-77 ms), so this is at
 * most ~4 ms of event-loop time. Longer texts go to the tokenizer thread.
 */
export const TOKENIZE_INLINE_CHARS_MAX = 512;

export interface TokenizeJob {
  id: number;
  dir: string;
  text: string;
}
export type TokenizeResult = { id: number; ids: Int32Array } | { id: number; error: string };

/**
 * One worker thread, shared by every model, that encodes long texts off the
 * event loop. Jobs run one after another (a queue, not a pool: the two cores
 * belong to the model workers); every text it gets is already bounded by the
 * model's context length in characters (see ModelText.charsPerTokenMax).
 */
class TokenizeThread {
  private readonly thread = new JobThread<TokenizeJob, TokenizeResult>('tokenize-worker.js', 'tokenizer thread');

  async encode(dir: string, text: string): Promise<number[]> {
    const r = await this.thread.run({ dir, text });
    if ('error' in r) throw new Error(r.error);
    return Array.from(r.ids);
  }
}

export const tokenizeThread = new TokenizeThread();
