import type { Ctx } from '../http/context.js';
import type { Reply } from '../http/router.js';
import { parse } from '../http/validate.js';
import { invalid } from '../errors.js';
import type { InferenceEngine } from './engine-api.js';
import type { Policies } from './policy-api.js';
import { DetokenizeRequest, TokenizeChat, TokenizeText } from './protocol.js';
import { chatChars, chatMessages, checkChars, resolveModel } from './serving-checks.js';

// vLLM's /tokenize and /detokenize: what a client needs to count tokens or check a
// prompt against the context length before sending it. No model work: the request
// limit applies (like the model list), no tokens are billed.

const findModel = (engine: InferenceEngine, id: string) => {
  const m = engine.model(id);
  // Either kind may be tokenized: resolveModel is used only for its 404.
  return m ?? resolveModel(engine, id, 'chat');
};

export async function serveTokenize(ctx: Ctx, engine: InferenceEngine, policies: Policies): Promise<Reply> {
  const body = await ctx.json();
  const chat = body !== null && typeof body === 'object' && 'messages' in body;
  const req = chat ? parse(TokenizeChat, body) : parse(TokenizeText, body);
  const model = findModel(engine, req.model);
  // A text that cannot fit the context is refused untokenised (its count would only say so, slowly).
  let tokens: number[];
  let headers: Record<string, string>;
  if ('messages' in req) {
    const messages = chatMessages(req.messages);
    checkChars(model, chatChars(messages), 'messages');
    headers = await policies.admitLight(ctx);
    tokens = await engine.encodeChat(model.id, messages);
  } else {
    checkChars(model, req.prompt.length, 'prompt');
    headers = await policies.admitLight(ctx);
    tokens = await engine.encodeText(model.id, req.prompt, req.add_special_tokens ?? true);
  }
  return {
    body: { count: tokens.length, max_model_len: model.contextLength, tokens, token_strs: req.return_token_strs ? engine.tokenStrings(model.id, tokens) : null },
    headers,
  };
}

export async function serveDetokenize(ctx: Ctx, engine: InferenceEngine, policies: Policies): Promise<Reply> {
  const req = parse(DetokenizeRequest, await ctx.json());
  const model = findModel(engine, req.model);
  const bad = req.tokens.findIndex((t) => t >= model.vocabSize);
  if (bad >= 0) throw invalid(`tokens.${bad}`, `must be a token id below ${model.vocabSize}, the vocabulary size of ${model.id}`, req.tokens[bad]);
  const headers = await policies.admitLight(ctx);
  return { body: { prompt: engine.decode(model.id, req.tokens) }, headers };
}
