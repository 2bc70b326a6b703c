// Finished chat generations whose caches a model's worker keeps, so that a later request of the
// same user that opens with the same tokens (the next turn of a conversation, which sends the
// whole conversation again; another conversation with the same system prompt) starts from the
// kept keys and values instead of prefilling them again: vLLM's automatic prefix caching,
// llama.cpp's `cache_prompt`. Matching is by the longest common opening of token ids, as
// llama.cpp's server compares a slot's tokens with a new prompt; the kept generation's tokens
// are its prompt and the tokens it generated that went back into its cache. (A prompt may also
// start from a generation of the same user that is still running: scheduler.ts `startFromKept`.)
//
// One user's kept generations are never another's: a prompt that starts faster tells its sender
// that someone sent those tokens before, so only the same user (the scope) finds them. Each
// request is billed as if it ran alone.

/** A finished generation whose cache the worker keeps (worker.ts `keep`). */
export interface KeptPrompt {
  /** Its sequence in the worker. */
  seq: number;
  scope: string;
  /** The tokens its cache holds, position by position. */
  tokens: readonly number[];
  bytes: number;
  /** Prompts starting from it in steps not yet answered: it is not freed under them. */
  forking: number;
}

/**
 * Openings shorter than this are run again rather than taken from a kept generation: a
 * conversation's shared tokens are its template's first few and its system prompt, and a copy
 * of a few positions saves less than it costs to look for (every user's request is compared
 * against its user's kept generations).
 */
export const KEPT_PROMPT_REUSE_TOKENS_MIN = 8;
/**
 * A kept opening is taken only where it is at least this part of the prompt's tokens left to run
 * after it. Those then attend over the copied positions too, and a long prompt's step of many
 * tokens over a cache costs more a token than a fresh one (which attends over its own tokens
 * only): m25 q4 on the prefill session, 309 tokens after 16 copied took 66-83 ms against 51-72
 * for all 325 fresh; 68 after 593 copied, 23-33 ms against 211-245 for all 661 fresh (bench/README.md
 * "Kept prompts"). A conversation's next turn (hundreds kept, tens new) passes by far; a
 * different conversation sharing only the chat template's first tokens does not.
 */
export const KEPT_PROMPT_REUSE_OVER_REST_MIN = 0.5;

/**
 * A kept generation's memory comes in blocks of this many positions (kept-arena.ts), as vLLM's
 * prefix cache keeps blocks of 16 tokens: freed blocks serve any later generation whatever its
 * length, and a generation in one run of blocks copies as one run per layer and head. Its last
 * block is part empty: a 30-token chat turn takes 32 positions' memory.
 */
export const KEPT_BLOCK_POSITIONS = 16;

/** The bytes a kept generation of `positions` takes (whole blocks): the scheduler's budget and the worker's arena count alike. */
export const keptBytesOf = (positions: number, bytesPerPosition: number): number => Math.ceil(positions / KEPT_BLOCK_POSITIONS) * KEPT_BLOCK_POSITIONS * bytesPerPosition;

/** Whether a prompt of `promptLength` tokens should start from another's first `at` (the two bounds above). */
export const worthStarting = (at: number, promptLength: number): boolean => at >= KEPT_PROMPT_REUSE_TOKENS_MIN && at >= KEPT_PROMPT_REUSE_OVER_REST_MIN * (promptLength - at);

/** The longest common opening of `a` and `b`, at most `max` tokens. */
export function commonOpening(a: readonly number[], b: readonly number[], max: number): number {
  const n = Math.min(a.length, b.length, max);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

export class KeptPrompts {
  /** By sequence, least recently used first (the first evicted). */
  private readonly bySeq = new Map<number, KeptPrompt>();
  private readonly byScope = new Map<string, Set<KeptPrompt>>();
  private heldBytes = 0;

  /**
   * @param bytesMax memory the kept caches may take (CHAT_PREFIX_CACHE_MB); 0 keeps none
   * @param bytesPerPosition a position's keys and values, every layer (a generation takes whole blocks of them: keptBytesOf)
   * @param free frees kept sequences in the worker (evicted, or replaced by a longer one of the same opening)
   */
  constructor(
    private readonly bytesMax: number,
    private readonly bytesPerPosition: number,
    private readonly free: (seqs: number[]) => void,
  ) {}

  get bytes(): number {
    return this.heldBytes;
  }

  get size(): number {
    return this.bySeq.size;
  }

  /** Whether a generation of this many cached positions would be kept at all. */
  fits(positions: number): boolean {
    return positions > 0 && keptBytesOf(positions, this.bytesPerPosition) <= this.bytesMax;
  }

  /**
   * The kept generation of `scope` that shares the longest opening with `prompt`, and that length:
   * at least KEPT_PROMPT_REUSE_TOKENS_MIN and KEPT_PROMPT_REUSE_OVER_REST_MIN of the rest, and
   * short of the prompt's last token (whose logits the new generation samples from, so it runs).
   */
  best(scope: string, prompt: readonly number[]): { kept: KeptPrompt; at: number } | undefined {
    let found: { kept: KeptPrompt; at: number } | undefined;
    for (const k of this.byScope.get(scope) ?? []) {
      const at = commonOpening(k.tokens, prompt, prompt.length - 1);
      if (at > (found?.at ?? 0)) found = { kept: k, at };
    }
    return found && worthStarting(found.at, prompt.length) ? found : undefined;
  }

  /** A prompt starts from `k`: it is the most recently used, and stays until `forked`. */
  use(k: KeptPrompt): void {
    this.bySeq.delete(k.seq);
    this.bySeq.set(k.seq, k);
    k.forking++;
  }

  /** The step that started a prompt from `k` has been answered (or failed). */
  forked(k: KeptPrompt): void {
    k.forking--;
    this.trim();
  }

  /**
   * Keeps a finished generation's cache (`tokens`: what it holds); answers false when it does not
   * fit at all (the caller frees it). Kept generations of the scope whose tokens open this one's
   * are freed: anything that would start from them starts at least as far along from this one.
   */
  add(seq: number, scope: string, tokens: readonly number[]): boolean {
    if (!this.fits(tokens.length)) return false;
    const k: KeptPrompt = { seq, scope, tokens, bytes: keptBytesOf(tokens.length, this.bytesPerPosition), forking: 0 };
    let mine = this.byScope.get(scope);
    if (!mine) this.byScope.set(scope, (mine = new Set()));
    const covered = [...mine].filter((o) => o.forking === 0 && o.tokens.length <= tokens.length && commonOpening(o.tokens, tokens, o.tokens.length) === o.tokens.length);
    mine.add(k);
    this.drop(covered);
    this.bySeq.set(seq, k);
    this.heldBytes += k.bytes;
    this.trim();
    return true;
  }

  /** Forgets them all without freeing (their worker is gone). */
  clear(): void {
    this.bySeq.clear();
    this.byScope.clear();
    this.heldBytes = 0;
  }

  /** Frees the least recently used until the rest fit (not those prompts are starting from). */
  private trim(): void {
    const out: KeptPrompt[] = [];
    let bytes = this.heldBytes;
    for (const k of this.bySeq.values()) {
      if (bytes <= this.bytesMax) break;
      if (k.forking) continue;
      out.push(k);
      bytes -= k.bytes;
    }
    this.drop(out);
  }

  private drop(ks: KeptPrompt[]): void {
    if (!ks.length) return;
    for (const k of ks) {
      this.bySeq.delete(k.seq);
      const mine = this.byScope.get(k.scope)!;
      mine.delete(k);
      if (!mine.size) this.byScope.delete(k.scope);
      this.heldBytes -= k.bytes;
    }
    this.free(ks.map((k) => k.seq));
  }
}
