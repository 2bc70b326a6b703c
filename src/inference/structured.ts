import { ApiError } from '../errors.js';
import type { Grammar } from './grammar/grammar.js';
import { jsonObjectGrammar, schemaGrammar, SchemaError } from './grammar/json-schema.js';
import type { ServedModel } from './engine-api.js';
import type { ChatCompletionRequest } from './protocol.js';

// response_format -> the grammar the worker's sampler holds the output to. Compiled once per
// distinct schema (clients send the same schema on every request) and cached by its text.

/** Distinct schemas kept compiled: a client's handful of response types, many clients. */
const GRAMMARS_CACHED_MAX = 256;
const cache = new Map<string, Grammar>();

function cached(key: string, make: () => Grammar): Grammar {
  let g = cache.get(key);
  if (g) {
    cache.delete(key);
  } else {
    g = make();
    if (cache.size >= GRAMMARS_CACHED_MAX) cache.delete(cache.keys().next().value!);
  }
  cache.set(key, g);
  return g;
}

/** The grammar a chat request's response_format asks for, or undefined for plain text. */
export function responseGrammar(rf: ChatCompletionRequest['response_format'], model: ServedModel): { key: string; grammar: Grammar } | undefined {
  if (!rf || rf.type === 'text') return undefined;
  if (!model.structuredOutput) {
    throw new ApiError('invalid', `response_format: model ${model.id} cannot constrain its output (its tokenizer's pieces are not plain text); use type "text"`, { param: 'response_format.type' });
  }
  if (rf.type === 'json_object' || !rf.json_schema.schema) return { key: 'json_object', grammar: cached('json_object', jsonObjectGrammar) };
  const text = JSON.stringify(rf.json_schema.schema);
  const key = `schema:${text}`;
  try {
    return { key, grammar: cached(key, () => schemaGrammar(rf.json_schema.schema)) };
  } catch (e) {
    if (!(e instanceof SchemaError)) throw e;
    const param = `response_format.json_schema.schema${e.path.replace(/\//g, '.')}`;
    throw new ApiError('invalid', `${param}: ${e.message}`, { param });
  }
}
