import { randomUUID } from 'node:crypto';
import { ApiError, invalid } from '../errors.js';
import type { Ctx } from '../http/context.js';
import type { Reply } from '../http/router.js';
import { parse } from '../http/validate.js';
import type { ChatMessage, GenerateEvent, ServedModel } from './engine-api.js';
import type { Policies, Usage } from './policy-api.js';
import { ChatCompletionRequest, type ChatCompletion, type ChatCompletionChunk, type FinishReason } from './protocol.js';
import { SseStream } from './sse.js';
import { noteError } from '../http/respond.js';

/** Time to first token, from the request's arrival, for the access log. */
function noteFirstToken(ctx: Ctx): void {
  ctx.note({ ttftMs: Math.round((performance.now() - ctx.startedAt) * 10) / 10 });
}

/** What chat serving needs from the engine. */
export interface ChatEngine {
  model(id: string): ServedModel | undefined;
  encodeChat(modelId: string, messages: ChatMessage[]): number[];
  generate(modelId: string, req: import('./engine-api.js').GenerateRequest): AsyncGenerator<GenerateEvent>;
}

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

export async function serveChat(ctx: Ctx, engine: ChatEngine, policies: Policies): Promise<Reply | undefined> {
  const req = parse(ChatCompletionRequest, await ctx.json());
  const model = resolveModel(engine, req.model, 'chat');
  ctx.note({ model: model.id, stream: req.stream === true });
  const messages: ChatMessage[] = req.messages.map((m) => ({
    role: m.role === 'developer' ? 'system' : m.role,
    content: m.content === null ? '' : typeof m.content === 'string' ? m.content : m.content.map((p) => p.text).join(''),
  }));
  const maxParam = req.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
  const maxTokens = req.max_completion_tokens ?? req.max_tokens ?? model.maxTokensDefault;
  if (maxTokens > model.maxTokensCap) throw invalid(maxParam, `must be at most ${model.maxTokensCap} for model ${model.id}`, maxTokens);
  const promptTokens = engine.encodeChat(model.id, messages);
  if (promptTokens.length + maxTokens > model.contextLength) {
    const what = promptTokens.length >= model.contextLength ? 'messages' : maxParam;
    throw new ApiError(
      'invalid',
      `this model's maximum context length is ${model.contextLength} tokens; the messages take ${promptTokens.length} and ${maxParam} asks for ${maxTokens}`,
      { param: what, code: 'context_length_exceeded' },
    );
  }
  const stop = req.stop == null ? [] : typeof req.stop === 'string' ? [req.stop] : req.stop;
  const admission = await policies.admit(ctx, model, promptTokens.length + maxTokens);
  const usage: Usage = { inputTokens: 0, outputTokens: 0 };
  let events: AsyncGenerator<GenerateEvent>;
  try {
    events = engine.generate(model.id, {
      promptTokens,
      maxTokens,
      temperature: req.temperature ?? 1,
      topP: req.top_p ?? 1,
      seed: req.seed ?? undefined,
      stop,
      signal: ctx.signal,
      // The engine reports what was really run, cancelled requests included: that is what is billed.
      onEnd: (u) => {
        ctx.note({ promptTokens: u.promptTokens, completionTokens: u.completionTokens });
        admission.settle({ inputTokens: u.promptTokens, outputTokens: u.completionTokens });
      },
    });
  } catch (e) {
    admission.settle({ inputTokens: 0, outputTokens: 0 });
    throw e;
  }
  const id = `chatcmpl-${randomUUID().replace(/-/g, '')}`;
  const created = Math.floor(Date.now() / 1000);
  const headers = { ...admission.headers, 'x-inference-id': id };
  ctx.note({ inferenceId: id });
  try {
    if (req.stream) {
      await streamChat(ctx, events, { id, created, model: model.id, includeUsage: req.stream_options?.include_usage === true }, headers, usage);
      return undefined;
    }
    let text = '';
    let finish: FinishReason = 'stop';
    for await (const ev of events) {
      if (ev.type === 'delta') {
        if (!text && ev.text) noteFirstToken(ctx);
        text += ev.text;
      } else {
        ctx.note({ finishReason: ev.finishReason });
        usage.inputTokens = ev.promptTokens;
        usage.outputTokens = ev.completionTokens;
        if (ev.finishReason === 'cancelled') throw new ApiError('timeout', 'generation was cancelled before it finished');
        finish = ev.finishReason;
      }
    }
    const body: ChatCompletion = {
      id,
      object: 'chat.completion',
      created,
      model: model.id,
      system_fingerprint: null,
      choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: finish, logprobs: null }],
      usage: { prompt_tokens: usage.inputTokens, completion_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens },
    };
    return { body, headers };
  } finally {
    await events.return(undefined);
  }
}

async function streamChat(
  ctx: Ctx,
  events: AsyncGenerator<GenerateEvent>,
  meta: { id: string; created: number; model: string; includeUsage: boolean },
  headers: Record<string, string>,
  usage: Usage,
): Promise<void> {
  const sse = new SseStream(ctx);
  const chunk = (delta: ChatCompletionChunk['choices'][0]['delta'], finish: FinishReason | null): ChatCompletionChunk => ({
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    system_fingerprint: null,
    choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
    ...(meta.includeUsage ? { usage: null } : {}),
  });
  // Headers (rate limits included) go out before the first token.
  if (!sse.start(headers)) return events.return(undefined).then(() => undefined);
  try {
    if (!(await sse.send(chunk({ role: 'assistant', content: '' }, null)))) return;
    let first = true;
    for await (const ev of events) {
      if (ev.type === 'delta') {
        if (first && ev.text) {
          first = false;
          noteFirstToken(ctx);
        }
        if (ev.text && !(await sse.send(chunk({ content: ev.text }, null)))) return; // client gone: finally cancels
        continue;
      }
      usage.inputTokens = ev.promptTokens;
      usage.outputTokens = ev.completionTokens;
      ctx.note({ finishReason: ev.finishReason });
      if (ev.finishReason === 'cancelled') return;
      await sse.send(chunk({}, ev.finishReason));
      if (meta.includeUsage) {
        await sse.send({
          id: meta.id, object: 'chat.completion.chunk', created: meta.created, model: meta.model, system_fingerprint: null, choices: [],
          usage: { prompt_tokens: usage.inputTokens, completion_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens },
        });
      }
      await sse.done();
      return;
    }
  } catch (e) {
    // The status line is gone already: report the error in-band, as OpenAI does, and end.
    const err = e instanceof ApiError ? e : new ApiError('internal', 'internal error during generation');
    noteError(ctx, err);
    await sse.send({ error: { message: err.message, type: 'server_error', code: err.code ?? null } });
    ctx.endStream();
    if (!(e instanceof ApiError)) throw e;
  } finally {
    // Ends the engine's iterator (frees the batch slot) if we left early.
    await events.return(undefined);
    if (!ctx.aborted && ctx.responded) ctx.endStream();
  }
}
