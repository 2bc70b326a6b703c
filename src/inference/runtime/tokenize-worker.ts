import { parentPort } from 'node:worker_threads';
import type { Tokenizer } from '@huggingface/tokenizers';
import { loadTokenizer, readTokenizerFiles } from './tokenizer.js';
import type { TokenizeJob, TokenizeResult } from './tokenize-thread.js';

// The tokenizer thread: long texts are encoded here so that the event loop keeps
// answering (a 4 MiB prompt took 37 s of main-thread time before this existed).

const tokenizers = new Map<string, Tokenizer>();

function load(dir: string): Tokenizer {
  let t = tokenizers.get(dir);
  if (!t) {
    tokenizers.set(dir, (t = loadTokenizer(readTokenizerFiles(dir))));
  }
  return t;
}

parentPort!.on('message', (job: TokenizeJob) => {
  let reply: TokenizeResult;
  try {
    const ids = Int32Array.from(load(job.dir).encode(job.text, { add_special_tokens: false }).ids);
    reply = { id: job.id, ids };
    parentPort!.postMessage(reply, [ids.buffer]);
  } catch (e) {
    reply = { id: job.id, error: (e as Error).message };
    parentPort!.postMessage(reply);
  }
});
