import { ApiError, invalid } from '../errors.js';
import type { ChatMessage, ServedModel } from './engine-api.js';
import type { ChatCompletionRequest } from './protocol.js';

// The rules every inference route applies before model work, decided once: which
// model (and of which kind), whether a text can fit its context (by characters, then
// by tokens), and how chat messages read to a chat template.

/** Looks a model up for a family of routes: 404 model_not_found, or 400 invalid_model for the wrong kind. */
export function resolveModel(engine: { model(id: string): ServedModel | undefined }, id: string, kind: ServedModel['kind']): ServedModel {
  const m = engine.model(id);
  if (!m) throw new ApiError('not_found', `model ${JSON.stringify(id)} does not exist; GET /api/v1/models lists the models`, { param: 'model', code: 'model_not_found' });
  if (m.kind !== kind) {
    const where = kind === 'chat' ? 'chat completions' : 'evaluations';
    throw new ApiError('invalid', `model ${JSON.stringify(id)} is an ${m.kind} model and cannot be used for ${where}`, { param: 'model', code: 'invalid_model' });
  }
  return m;
}

/**
 * Refuses a text that cannot fit the context before it is tokenised (the tokenizer
 * costs 4-8 µs per character: a 4 MiB prompt is half a minute of CPU): no token
 * stands for more than `charsPerTokenMax` characters, so this is a lower bound.
 */
export function checkChars(model: ServedModel, chars: number, param: string): void {
  const tokensMin = Math.ceil(chars / model.charsPerTokenMax);
  if (tokensMin > model.contextLength) {
    throw new ApiError(
      'invalid',
      `this model's maximum context length is ${model.contextLength} tokens; ${param} has ${chars} characters, at least ${tokensMin} tokens (no token of ${model.id} stands for more than ${model.charsPerTokenMax} characters)`,
      { param, code: 'context_length_exceeded' },
    );
  }
}

/** The characters of a chat's messages, for checkChars. */
export const chatChars = (ms: ChatMessage[]): number => ms.reduce((n, m) => n + m.role.length + m.content.length, 0);

/** The cap on the completion and the context length (prompt + completion), each a 400 naming its field. */
export function checkContext(model: ServedModel, promptLen: number, promptParam: string, maxTokens: number, maxParam: string): void {
  // The model has nothing to continue from (an empty prompt on a model without a BOS token).
  if (promptLen === 0) throw invalid(promptParam, 'must encode to at least one token', '');
  if (maxTokens > model.maxTokensCap) throw invalid(maxParam, `must be at most ${model.maxTokensCap} for model ${model.id}`, maxTokens);
  if (promptLen + maxTokens > model.contextLength) {
    throw new ApiError(
      'invalid',
      `this model's maximum context length is ${model.contextLength} tokens; ${promptParam} has ${promptLen} tokens and ${maxParam} asks for ${maxTokens}`,
      { param: promptLen >= model.contextLength ? promptParam : maxParam, code: 'context_length_exceeded' },
    );
  }
}

/** Messages as the chat template takes them: `developer` is `system`, text parts joined. */
export function chatMessages(ms: ChatCompletionRequest['messages']): ChatMessage[] {
  return ms.map((m) => {
    let content = m.content == null ? '' : typeof m.content === 'string' ? m.content : m.content.map((p) => p.text).join('');
    // A tool call in the history is rendered as the model would have written it: {"name", "arguments"}.
    for (const c of m.tool_calls ?? []) content += JSON.stringify({ name: c.function.name, arguments: safeJson(c.function.arguments) });
    return { role: m.role === 'developer' ? 'system' : m.role, content };
  });
}

function safeJson(s: string): unknown {
  try {
    return JSON.parse(s);
  } catch {
    return s;
  }
}
