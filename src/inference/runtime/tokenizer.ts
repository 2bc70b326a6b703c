import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';

// A model folder's tokenizer, with its BPE cache bounded (the main thread and the
// tokenizer thread both load through here).
//
// The library caches the BPE pieces of every pre-token shorter than 256 characters, up
// to 10,000 of them. A SentencePiece-style (Metaspace) tokenizer does not split text into
// words, so each distinct short prompt or evaluation state is one cache entry holding an
// array of piece strings: a 6-minute soak grew the main thread's heap by 11 MiB of them
// (docs/faults.md "Memory"), toward tens of MiB per tokenizer. Word-level entries are
// what the cache is for: words are shorter than this, whole texts longer.
const BPE_CACHE_KEY_CHARS_MAX = 64;
/** Entries per tokenizer: the distinct words of a busy day's traffic; about 1 MiB at most. */
const BPE_CACHE_ENTRIES_MAX = 2_000;

export interface TokenizerFiles {
  tokenizer: unknown;
  config: Record<string, unknown>;
}

export const readTokenizerFiles = (dir: string): TokenizerFiles => {
  const read = (f: string) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
  return { tokenizer: read('tokenizer.json'), config: read('tokenizer_config.json') };
};

export function loadTokenizer(files: TokenizerFiles): Tokenizer {
  const t = new Tokenizer(files.tokenizer as never, files.config as never);
  const model = (t as unknown as { model?: { max_length_to_cache?: number; cache?: { capacity?: number } } }).model;
  if (model?.cache && typeof model.cache.capacity === 'number') {
    model.max_length_to_cache = BPE_CACHE_KEY_CHARS_MAX;
    model.cache.capacity = BPE_CACHE_ENTRIES_MAX;
  }
  return t;
}
