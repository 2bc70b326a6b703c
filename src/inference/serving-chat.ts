import { randomUUID } from 'node:crypto';
import { ApiError, invalid } from '../errors.js';
import type { Ctx } from '../http/context.js';
import type { Reply } from '../http/router.js';
import { takeTurn } from '../turns.js';
import { parse } from '../http/validate.js';
import type { Cuts, GenerateEvent, InferenceEngine, LogitAdjust, ServedModel, TokenLogprob, TokenUsage } from './engine-api.js';
import type { Policies } from './policy-api.js';
import { ChatCompletionRequest, openAiUsage, type ChatCompletion, type ChatCompletionChunk, type ChoiceLogprobs, type FinishReason, type LogprobItem } from './protocol.js';
import type { BodyScreen } from './screen.js';
import { jsonWithText, SENT, SseStream } from './sse.js';
import { chatChars, chatMessages, checkChars, checkContext, resolveModel } from './serving-checks.js';
import { unfinished } from './outcome.js';
import { responseGrammar, toolCallOf, toolPlan, type ToolPlan } from './structured.js';

/** Time to first token (request arrival to the first token made), for the access log; answers false (not first any more). */
function noteFirstToken(ctx: Ctx): false {
  ctx.note({ ttftMs: Math.round((performance.now() - ctx.startedAt) * 10) / 10 });
  return false;
}

/** Turns the engine's token logprobs into OpenAI's items (token text, UTF-8 bytes, alternatives). */
export function logprobItems(engine: InferenceEngine, modelId: string): (ids: number[], lps: TokenLogprob[]) => LogprobItem[] {
  const dec = new TextDecoder();
  const piece = (id: number) => {
    const bytes = engine.tokenBytes(modelId, id);
    return { token: dec.decode(bytes), bytes: [...bytes] };
  };
  return (ids, lps) =>
    lps.map((lp, i) => ({
      ...piece(ids[i]!),
      logprob: lp.logprob,
      top_logprobs: lp.top.map(([id, logprob]) => ({ ...piece(id), logprob })),
    }));
}

const callId = () => `call_${randomUUID().replace(/-/g, '').slice(0, 24)}`;

/** top_k / min_p and logit_bias / penalties as the engine takes them; absent when they change nothing. */
export function samplingOf(
  req: { top_k?: number | null; min_p?: number | null; logit_bias?: Record<string, number> | null; presence_penalty?: number | null; frequency_penalty?: number | null },
  model: ServedModel,
): { cuts?: Cuts; adjust?: LogitAdjust } {
  const bias: Array<[number, number]> = [];
  for (const [k, v] of Object.entries(req.logit_bias ?? {})) {
    const id = Number(k);
    if (id >= model.vocabSize) throw invalid(`logit_bias.${k}`, `must be a token id below ${model.vocabSize}, the vocabulary size of ${model.id}`, k);
    if (v !== 0) bias.push([id, v]);
  }
  const presence = req.presence_penalty ?? 0;
  const frequency = req.frequency_penalty ?? 0;
  const topK = req.top_k != null && req.top_k > 0 ? req.top_k : 0;
  const minP = req.min_p ?? 0;
  return {
    ...(topK > 0 || minP > 0 ? { cuts: { topK, minP } } : {}),
    ...(bias.length > 0 || presence !== 0 || frequency !== 0 ? { adjust: { bias, presence, frequency } } : {}),
  };
}

/** Who may start from whose kept prompts (runtime/kept-prompts.ts): the request's user, unless llama.cpp's `cache_prompt: false` asks for none. */
export function shareScopeOf(req: { cache_prompt?: boolean | null }, ctx: Ctx): { shareScope?: string } {
  return req.cache_prompt === false ? {} : { shareScope: ctx.principal.userId };
}

/** A generating request's tokens on its access log line (cached ones where some were). */
export function noteUsage(ctx: Ctx, u: TokenUsage): void {
  ctx.note({ promptTokens: u.inputTokens, completionTokens: u.outputTokens, ...(u.cachedInputTokens ? { cachedTokens: u.cachedInputTokens } : {}) });
}

export async function serveChat(ctx: Ctx, engine: InferenceEngine, policies: Policies, screen: BodyScreen): Promise<Reply | undefined> {
  const body = await screen.json(ctx, 'chat');
  await takeTurn(); // parsing, tokenising and admission: one request a turn (src/turns.ts)
  const req = parse(ChatCompletionRequest, body);
  if (!req.stream) ctx.useDefaultDeadline();
  const model = resolveModel(engine, req.model, 'chat');
  ctx.note({ model: model.id, stream: req.stream === true });
  const messages = chatMessages(req.messages);
  const maxParam = req.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
  const maxTokens = req.max_completion_tokens ?? req.max_tokens ?? model.maxTokensDefault;
  checkChars(model, chatChars(messages), 'messages');
  await policies.check(ctx);
  const promptTokens = await engine.encodeChat(model.id, messages);
  checkContext(model, promptTokens.length, 'messages', maxTokens, maxParam);
  const stop = req.stop == null ? [] : typeof req.stop === 'string' ? [req.stop] : req.stop;
  const tool = toolPlan(req, model);
  const grammar = tool?.grammar ?? responseGrammar(req.response_format, model);
  const admission = await policies.admit(ctx, model, promptTokens.length + maxTokens);
  let events: AsyncGenerator<GenerateEvent>;
  try {
    events = engine.generate(model.id, {
      promptTokens,
      maxTokens,
      temperature: req.temperature ?? 1,
      topP: req.top_p ?? 1,
      seed: req.seed ?? undefined,
      ...samplingOf(req, model),
      ...(req.logprobs ? { topLogprobs: req.top_logprobs ?? 0 } : {}),
      ...(grammar ? { grammar } : {}),
      stop,
      signal: ctx.signal,
      ...shareScopeOf(req, ctx),
      // The engine reports what was really run, cancelled requests included: that is what is billed.
      onEnd: (u) => {
        noteUsage(ctx, u);
        admission.settle(u);
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
      const meta = { id, created, model: model.id, includeUsage: req.stream_options?.include_usage === true, logprobs: req.logprobs ? logprobItems(engine, model.id) : undefined, tool };
      await streamChat(ctx, events, meta, headers);
      return undefined;
    }
    let text = '';
    let finish: FinishReason = 'stop';
    let usage: TokenUsage = { inputTokens: 0, outputTokens: 0 };
    const items: LogprobItem[] = [];
    const toItem = logprobItems(engine, model.id);
    let first = true;
    for await (const ev of events) {
      if (ev.type === 'delta') {
        if (first && ev.tokenIds.length) first = noteFirstToken(ctx);
        text += ev.text;
        if (ev.logprobs) items.push(...toItem(ev.tokenIds, ev.logprobs));
      }
      else {
        ctx.note({ finishReason: ev.finishReason });
        usage = ev.usage;
        if (ev.finishReason === 'cancelled' || ev.finishReason === 'failed') throw unfinished(ev, ctx.signal, ctx.aborted) ?? ctx.signal.reason;
        finish = ev.finishReason;
      }
    }
    let message: ChatCompletion['choices'][0]['message'] = { role: 'assistant', content: text };
    const call = tool && toolCallOf(tool, text, finish === 'stop');
    if (call) {
      message = { role: 'assistant', content: null, tool_calls: [{ id: callId(), type: 'function', function: call }] };
      if (finish === 'stop') finish = 'tool_calls';
    }
    const body: ChatCompletion = {
      id,
      object: 'chat.completion',
      created,
      model: model.id,
      system_fingerprint: null,
      choices: [{ index: 0, message, finish_reason: finish, logprobs: req.logprobs ? { content: items, refusal: null } : null }],
      usage: openAiUsage(usage),
    };
    return { body, headers };
  } finally {
    await events.return(undefined);
  }
}

async function streamChat(
  ctx: Ctx,
  events: AsyncGenerator<GenerateEvent>,
  meta: { id: string; created: number; model: string; includeUsage: boolean; logprobs: ReturnType<typeof logprobItems> | undefined; tool: ToolPlan | undefined },
  headers: Record<string, string>,
): Promise<void> {
  const sse = new SseStream(ctx);
  const chunk = (delta: ChatCompletionChunk['choices'][0]['delta'], finish: FinishReason | null, logprobs: ChoiceLogprobs = null): ChatCompletionChunk => ({
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    system_fingerprint: null,
    choices: [{ index: 0, delta, finish_reason: finish, logprobs }],
    ...(meta.includeUsage ? { usage: null } : {}),
  });
  const contentJson = jsonWithText((text) => chunk({ content: text }, null));
  // Headers (rate limits included) go out before the first token.
  if (!sse.start(headers)) return events.return(undefined).then(() => undefined);
  try {
    const tool = meta.tool;
    if (!(await sse.send(chunk({ role: 'assistant', content: tool ? null : '' }, null)))) return;
    let first = true;
    // A named call streams its arguments as OpenAI does (the call's id and name first); a call
    // whose function the model picks is sent whole at the end, once the name is known.
    const toolId = callId();
    let toolText = '';
    let toolStarted = false;
    const toolDelta = (args: string): ChatCompletionChunk['choices'][0]['delta'] => {
      const d = { tool_calls: [toolStarted ? { index: 0, function: { arguments: args } } : { index: 0, id: toolId, type: 'function' as const, function: { name: tool!.name!, arguments: args } }] };
      toolStarted = true;
      return d;
    };
    for await (const ev of events) {
      if (ev.type === 'delta') {
        if (first && ev.tokenIds.length) first = noteFirstToken(ctx);
        // A token whose text is held back (a possible stop string) still reports its logprob, with empty content.
        const lp = meta.logprobs && ev.logprobs ? { content: meta.logprobs(ev.tokenIds, ev.logprobs), refusal: null } : null;
        if (tool) {
          toolText += ev.text;
          if (tool.name === undefined) continue;
          if ((ev.text || lp) && !(await sse.send(chunk(toolDelta(ev.text), null, lp)))) return;
          continue;
        }
        if (!ev.text && !lp) continue;
        const sent = lp ? sse.send(chunk({ content: ev.text }, null, lp)) : sse.sendJson(contentJson(ev.text));
        if (sent !== SENT && !(await sent)) return; // client gone: finally cancels
        continue;
      }
      ctx.note({ finishReason: ev.finishReason });
      if (ev.finishReason === 'cancelled' || ev.finishReason === 'failed') {
        const err = unfinished(ev, ctx.signal, ctx.aborted);
        if (err) await sse.fail(err);
        return;
      }
      let finish: FinishReason = ev.finishReason;
      if (tool) {
        const call = toolCallOf(tool, toolText, finish === 'stop');
        if (call && tool.name === undefined) await sse.send(chunk({ tool_calls: [{ index: 0, id: toolId, type: 'function', function: call }] }, null));
        else if (call && !toolStarted) await sse.send(chunk(toolDelta(''), null));
        else if (!call && toolText) await sse.send(chunk({ content: toolText }, null));
        if (call && finish === 'stop') finish = 'tool_calls';
      }
      await sse.send(chunk({}, finish));
      if (meta.includeUsage) {
        await sse.send({
          id: meta.id, object: 'chat.completion.chunk', created: meta.created, model: meta.model, system_fingerprint: null, choices: [],
          usage: openAiUsage(ev.usage),
        });
      }
      await sse.done();
      return;
    }
  } catch (e) {
    // The status line is gone already: report the error in-band, as OpenAI does, and end.
    await sse.fail(e instanceof ApiError ? e : new ApiError('internal', 'internal error during generation'));
    if (!(e instanceof ApiError)) throw e;
  } finally {
    // Ends the engine's iterator (frees the batch slot) if we left early.
    await events.return(undefined);
    if (!ctx.aborted && ctx.responded) ctx.endStream();
  }
}
