import { randomUUID } from 'node:crypto';
import { ApiError, invalid } from '../errors.js';
import type { Ctx } from '../http/context.js';
import type { Reply } from '../http/router.js';
import { takeTurn } from '../turns.js';
import { parse } from '../http/validate.js';
import type { GenerateEvent, InferenceEngine, ServedModel, TokenLogprob, TokenUsage } from './engine-api.js';
import type { Policies } from './policy-api.js';
import { COMPLETION_MAX_TOKENS_DEFAULT, CompletionRequest, openAiUsage, type Completion, type FinishReason, type LegacyLogprobs, type Usage } from './protocol.js';
import { noteUsage, samplingOf, shareScopeOf } from './serving-chat.js';
import { checkChars, checkContext, resolveModel } from './serving-checks.js';
import type { BodyScreen } from './screen.js';
import { SseStream } from './sse.js';
import { unfinished } from './outcome.js';

// POST /v1/completions: OpenAI's legacy text completions, which `vllm bench serve`,
// lm-evaluation-harness and the Kubernetes inference gateway speak. Same admission,
// rate limits and billing as chat; each prompt of a batch is its own generation.

interface Prompt {
  tokens: number[];
  /** What `echo` puts before the completion. */
  text: string;
}

async function prompts(req: CompletionRequest, engine: InferenceEngine, model: ServedModel, ctx: Ctx, policies: Policies): Promise<Prompt[]> {
  const p = req.prompt;
  const list: Array<string | number[]> = typeof p === 'string' ? [p] : typeof p[0] === 'number' ? [p as number[]] : (p as Array<string | number[]>);
  // A lone prompt (a string or one token list) is `prompt`; one of a batch is `prompt.<i>`.
  const single = typeof p === 'string' || typeof p[0] === 'number';
  const paramOf = (i: number) => (single ? 'prompt' : `prompt.${i}`);
  // Cheap refusals first: characters against the context, then the wallet; tokenising last.
  list.forEach((x, i) => typeof x === 'string' && checkChars(model, x.length, paramOf(i)));
  await policies.check(ctx);
  const out: Prompt[] = [];
  for (const [i, x] of list.entries()) out.push(await prompt(engine, model, x, paramOf(i)));
  return out;
}

async function prompt(engine: InferenceEngine, model: ServedModel, x: string | number[], param: string): Promise<Prompt> {
  if (typeof x === 'string') {
    // As vLLM does: BOS first when the tokenizer config says so.
    const tokens = await engine.encodeText(model.id, x, true);
    if (tokens.length === 0) throw invalid(param, 'must encode to at least one token', x);
    return { tokens, text: x };
  }
  const bad = x.findIndex((t) => t >= model.vocabSize);
  if (bad >= 0) throw invalid(`${param}.${bad}`, `must be a token id below ${model.vocabSize}, the vocabulary size of ${model.id}`, x[bad]);
  return { tokens: x, text: engine.decode(model.id, x) };
}

/** Legacy logprobs: parallel arrays of token texts, logprobs, top alternatives and character offsets. */
function legacyLogprobs(engine: InferenceEngine, modelId: string) {
  const dec = new TextDecoder();
  const text = (id: number) => dec.decode(engine.tokenBytes(modelId, id));
  return (into: LegacyLogprobs, ids: number[], lps: TokenLogprob[], offset: number): number => {
    lps.forEach((lp, i) => {
      const t = text(ids[i]!);
      into.tokens.push(t);
      into.token_logprobs.push(lp.logprob);
      into.top_logprobs.push(Object.fromEntries(lp.top.map(([id, v]) => [text(id), v])));
      into.text_offset.push(offset);
      offset += t.length;
    });
    return offset;
  };
}

export async function serveCompletion(ctx: Ctx, engine: InferenceEngine, policies: Policies, screen: BodyScreen): Promise<Reply | undefined> {
  const body = await screen.json(ctx, 'completion');
  await takeTurn(); // parsing, tokenising and admission: one request a turn (src/turns.ts)
  const req = parse(CompletionRequest, body);
  if (!req.stream) ctx.useDefaultDeadline();
  const model = resolveModel(engine, req.model, 'chat');
  const list = await prompts(req, engine, model, ctx, policies);
  const maxTokens = req.max_tokens ?? COMPLETION_MAX_TOKENS_DEFAULT;
  list.forEach((p, i) => checkContext(model, p.tokens.length, list.length === 1 ? 'prompt' : `prompt.${i}`, maxTokens, 'max_tokens'));
  const stop = req.stop == null ? [] : typeof req.stop === 'string' ? [req.stop] : req.stop;
  const admission = await policies.admit(ctx, model, list.reduce((a, p) => a + p.tokens.length + maxTokens, 0));
  // One settle for the request: after every generation has reported what it really ran.
  const total: TokenUsage = { inputTokens: 0, outputTokens: 0 };
  let left = list.length;
  const ended = (u: TokenUsage) => {
    total.inputTokens += u.inputTokens;
    total.outputTokens += u.outputTokens;
    if (u.cachedInputTokens) total.cachedInputTokens = (total.cachedInputTokens ?? 0) + u.cachedInputTokens;
    if (--left > 0) return;
    noteUsage(ctx, total);
    admission.settle(total);
  };
  const gens: AsyncGenerator<GenerateEvent>[] = [];
  try {
    for (const p of list) {
      gens.push(
        engine.generate(model.id, {
          promptTokens: p.tokens,
          maxTokens,
          temperature: req.temperature ?? 1,
          topP: req.top_p ?? 1,
          seed: req.seed ?? undefined,
          ...samplingOf(req, model),
          ...(req.logprobs != null ? { topLogprobs: req.logprobs } : {}),
          stop,
          signal: ctx.signal,
          ...shareScopeOf(req, ctx),
          onEnd: ended,
        }),
      );
    }
  } catch (e) {
    // Those never started report nothing: settle them as empty; the started ones settle as they close.
    for (let i = gens.length; i < list.length; i++) ended({ inputTokens: 0, outputTokens: 0 });
    await Promise.all(gens.map((g) => g.return(undefined)));
    throw e;
  }
  const id = `cmpl-${randomUUID().replace(/-/g, '')}`;
  const created = Math.floor(Date.now() / 1000);
  const headers = { ...admission.headers, 'x-inference-id': id };
  const toLegacy = legacyLogprobs(engine, model.id);
  const usageOf = () => openAiUsage(total);
  try {
    if (req.stream) {
      await streamCompletion(ctx, gens, list, { id, created, model: model.id, echo: req.echo === true, includeUsage: req.stream_options?.include_usage === true, logprobs: req.logprobs != null ? toLegacy : undefined, usage: usageOf }, headers);
      return undefined;
    }
    const choices = await Promise.all(
      gens.map(async (g, index) => {
        let text = req.echo ? list[index]!.text : '';
        const lp: LegacyLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
        let offset = text.length;
        let finish: FinishReason = 'stop';
        for await (const ev of g) {
          if (ev.type === 'delta') {
            if (ev.logprobs) offset = toLegacy(lp, ev.tokenIds, ev.logprobs, offset);
            text += ev.text;
          } else if (ev.finishReason === 'cancelled' || ev.finishReason === 'failed') throw unfinished(ev, ctx.signal, ctx.aborted) ?? ctx.signal.reason;
          else finish = ev.finishReason;
        }
        return { index, text, logprobs: req.logprobs != null ? lp : null, finish_reason: finish };
      }),
    );
    const body: Completion = { id, object: 'text_completion', created, model: model.id, system_fingerprint: null, choices, usage: usageOf() };
    return { body, headers };
  } finally {
    await Promise.all(gens.map((g) => g.return(undefined)));
  }
}

async function streamCompletion(
  ctx: Ctx,
  gens: AsyncGenerator<GenerateEvent>[],
  list: Prompt[],
  meta: {
    id: string;
    created: number;
    model: string;
    echo: boolean;
    includeUsage: boolean;
    logprobs: ReturnType<typeof legacyLogprobs> | undefined;
    usage: () => Usage;
  },
  headers: Record<string, string>,
): Promise<void> {
  const sse = new SseStream(ctx);
  const chunk = (index: number, text: string, finish: FinishReason | null, logprobs: LegacyLogprobs | null = null): Completion => ({
    id: meta.id,
    object: 'text_completion',
    created: meta.created,
    model: meta.model,
    system_fingerprint: null,
    choices: [{ index, text, logprobs, finish_reason: finish }],
    ...(meta.includeUsage ? { usage: null } : {}),
  });
  if (!sse.start(headers)) return;
  let gone = false;
  const send = async (c: unknown) => (gone ||= !(await sse.send(c)));
  try {
    // Each prompt streams on its own; frames of different choices interleave whole, by index.
    await Promise.all(
      gens.map(async (g, index) => {
        if (meta.echo && (await send(chunk(index, list[index]!.text, null)))) return;
        let offset = meta.echo ? list[index]!.text.length : 0;
        for await (const ev of g) {
          if (gone) return;
          if (ev.type === 'delta') {
            let lp: LegacyLogprobs | null = null;
            if (meta.logprobs && ev.logprobs) {
              lp = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
              offset = meta.logprobs(lp, ev.tokenIds, ev.logprobs, offset);
            }
            if ((ev.text || lp) && (await send(chunk(index, ev.text, null, lp)))) return;
            continue;
          }
          if (ev.finishReason === 'cancelled' || ev.finishReason === 'failed') {
            // The first choice that cannot finish ends the whole stream, told why.
            const err = unfinished(ev, ctx.signal, ctx.aborted);
            const first = !gone;
            gone = true;
            if (first && err) await sse.fail(err);
            return;
          }
          await send(chunk(index, '', ev.finishReason));
        }
      }),
    );
    if (gone) return;
    if (meta.includeUsage) await sse.send({ id: meta.id, object: 'text_completion', created: meta.created, model: meta.model, system_fingerprint: null, choices: [], usage: meta.usage() });
    await sse.done();
  } catch (e) {
    // The status line is gone already: report the error in-band, as OpenAI does, and end.
    await sse.fail(e instanceof ApiError ? e : new ApiError('internal', 'internal error during generation'));
    if (!(e instanceof ApiError)) throw e;
  } finally {
    if (!ctx.aborted && ctx.responded) ctx.endStream();
  }
}
