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

/** A forced tool call: the grammar its arguments follow, and the function when it is known up front. */
export interface ToolPlan {
  grammar: { key: string; grammar: Grammar };
  /** Named function (or the only tool): the output is its arguments. Unset: the output is {"name", "arguments"}. */
  name?: string;
}

/**
 * tool_choice "required" or a named function: the answer is a call whose arguments are held
 * to the function's parameter schema (as vLLM does for named function calling). With several
 * tools and "required", the model writes {"name": <one of them>, "arguments": {...}}.
 */
export function toolPlan(req: ChatCompletionRequest, model: ServedModel): ToolPlan | undefined {
  const choice = req.tool_choice;
  const tools = req.tools ?? [];
  if (!choice || choice === 'none' || tools.length === 0) return undefined;
  if (!model.structuredOutput) {
    throw new ApiError('invalid', `tool_choice: model ${model.id} cannot constrain its output (its tokenizer's pieces are not plain text)`, { param: 'tool_choice' });
  }
  const params = (t: (typeof tools)[number]) => t.function.parameters ?? { type: 'object' };
  const compile = (schema: unknown, param: string) => {
    const key = `schema:${JSON.stringify(schema)}`;
    try {
      return { key, grammar: cached(key, () => schemaGrammar(schema)) };
    } catch (e) {
      if (!(e instanceof SchemaError)) throw e;
      const p = `${param}${e.path.replace(/\//g, '.')}`;
      throw new ApiError('invalid', `${p}: ${e.message}`, { param: p });
    }
  };
  const named = typeof choice === 'object' ? choice.function.name : tools.length === 1 ? tools[0]!.function.name : undefined;
  if (named !== undefined) {
    const i = tools.findIndex((t) => t.function.name === named);
    return { name: named, grammar: compile(params(tools[i]!), `tools.${i}.function.parameters`) };
  }
  const wrapper = {
    anyOf: tools.map((t) => ({ type: 'object', properties: { name: { const: t.function.name }, arguments: params(t) }, required: ['name', 'arguments'], additionalProperties: false })),
  };
  return { grammar: compile(wrapper, 'tools') };
}

/** The call a finished tool-mode output makes; undefined when the output was cut short of one. */
export function toolCallOf(plan: ToolPlan, text: string, complete: boolean): { name: string; arguments: string } | undefined {
  if (plan.name !== undefined) return { name: plan.name, arguments: text };
  if (!complete) return undefined;
  const o = JSON.parse(text) as { name: string; arguments: unknown };
  return { name: o.name, arguments: JSON.stringify(o.arguments) };
}
