import { ApiError } from '../errors.js';
import type { Route } from '../http/router.js';
import type { InferenceEngine, ServedModel } from './engine-api.js';
import type { Policies } from './policy-api.js';
import {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionRequest,
  Completion,
  CompletionRequest,
  DetokenizeRequest,
  DetokenizeResponse,
  EvaluationRequest,
  EvaluationResponse,
  ModelList,
  ModelObject,
  TokenizeRequest,
  TokenizeResponse,
} from './protocol.js';
import { servingEngine } from './outcome.js';
import { PRIME_TEAM_HEADER, TEAM_HEADER } from './policy/team-header.js';
import { serveChat } from './serving-chat.js';
import { serveCompletion } from './serving-completions.js';
import { serveEvaluation } from './serving-eval.js';
import { BodyScreen } from './screen.js';
import { serveDetokenize, serveTokenize } from './serving-tokenize.js';

export interface InferenceLimits {
  chatBodyBytesMax: number;
  evalBodyBytesMax: number;
  streamTimeoutMs: number;
}

/** Headers every model-work route reads (policy/policies.ts, policy/team-header.ts). */
const PAYER_HEADERS = {
  [TEAM_HEADER]: 'bill the team of this id (the caller must be a member: 403 otherwise) instead of the caller\'s own wallet',
  [PRIME_TEAM_HEADER]: 'alias of x-service-team-id (Prime\'s CLI); both present and different: 400',
  'x-rft-run-id': 'count the usage against this RFT run of the caller\'s (404 when it is not theirs)',
};

const modelObject = (m: ServedModel): ModelObject => ({
  id: m.id,
  object: 'model',
  created: m.created,
  owned_by: m.ownedBy,
  max_model_len: m.contextLength,
  kind: m.kind,
});

/**
 * The OpenAI-compatible routes live under both prefixes: `/v1` is the base URL every
 * OpenAI-compatible tool assumes (vLLM, llama.cpp), `/api/v1` is the spec's. One handler each.
 */
export const INFERENCE_PREFIXES = ['/v1', '/api/v1'] as const;

export function inferenceRoutes(runtime: InferenceEngine, policies: Policies, limits: InferenceLimits): Route[] {
  // The engine reports its own errors; the serving code sees them as API errors.
  const engine = servingEngine(runtime);
  const base = { family: 'inference' as const, auth: 'inference:use' as const };
  const screen = new BodyScreen(engine.list());
  // The model list is fixed after start: serialise it once.
  const listBody = JSON.stringify({ object: 'list', data: engine.list().map(modelObject) });
  const evalRoute = (path: string, gateway: boolean): Route => ({
    ...base,
    method: 'POST',
    path,
    doc: {
      summary: gateway ? 'Answers typed questions about a state (the AI SDK gateway\'s path and shape)' : 'Answers typed questions about a state',
      tag: 'evaluations',
      body: EvaluationRequest,
      responses: { 200: EvaluationResponse },
      headers: gateway
        ? {
            ...PAYER_HEADERS,
            'ai-model-id': 'the model, when the body names none (the AI SDK gateway sends it here)',
            'ai-evaluation-model-specification-version': 'the specification version the caller speaks; another than ours answers with a compatibility warning',
          }
        : PAYER_HEADERS,
    },
    bodyBytesMax: limits.evalBodyBytesMax,
    handler: (ctx) => serveEvaluation(ctx, engine, policies, screen, gateway),
  });
  const openai = (prefix: string): Route[] => [
    { ...base, method: 'GET', path: `${prefix}/models`, doc: { summary: 'The models served', tag: 'models', responses: { 200: ModelList } }, handler: async (ctx) => ({ raw: listBody, headers: await policies.admitLight(ctx) }) },
    {
      ...base,
      method: 'GET',
      path: `${prefix}/models/*modelId`,
      doc: { summary: 'One model (its id may contain slashes)', tag: 'models', responses: { 200: ModelObject } },
      handler: async (ctx) => {
        const m = engine.model(ctx.params.modelId!);
        if (!m) throw new ApiError('not_found', `model ${JSON.stringify(ctx.params.modelId)} does not exist`, { param: 'model', code: 'model_not_found' });
        return { body: modelObject(m), headers: await policies.admitLight(ctx) };
      },
    },
    {
      ...base,
      method: 'POST',
      path: `${prefix}/chat/completions`,
      doc: {
        summary: 'A chat completion; with stream: true, server-sent chunks ending with [DONE]',
        tag: 'chat',
        body: ChatCompletionRequest,
        responses: { 200: { json: ChatCompletion, sse: ChatCompletionChunk } },
        headers: PAYER_HEADERS,
      },
      bodyBytesMax: limits.chatBodyBytesMax,
      // A stream ends by the stream deadline; the handler gives a request that
      // does not stream the default one (REQUEST_TIMEOUT_MS) once its body says so.
      timeoutMs: limits.streamTimeoutMs,
      handler: (ctx) => serveChat(ctx, engine, policies, screen),
    },
    {
      ...base,
      method: 'POST',
      path: `${prefix}/completions`,
      doc: {
        summary: 'A text completion (legacy); with stream: true, server-sent completions ending with [DONE]',
        tag: 'completions',
        body: CompletionRequest,
        responses: { 200: { json: Completion, sse: Completion } },
        headers: PAYER_HEADERS,
      },
      bodyBytesMax: limits.chatBodyBytesMax,
      timeoutMs: limits.streamTimeoutMs,
      handler: (ctx) => serveCompletion(ctx, engine, policies, screen),
    },
    evalRoute(`${prefix}/evaluations`, false),
  ];
  return [
    ...INFERENCE_PREFIXES.flatMap(openai),
    evalRoute('/v4/ai/evaluation-model', true),
    // vLLM serves these at the root.
    {
      ...base,
      method: 'POST',
      path: '/tokenize',
      doc: { summary: 'Token ids of a prompt or chat messages (vLLM)', tag: 'tokenize', body: TokenizeRequest, responses: { 200: TokenizeResponse } },
      bodyBytesMax: limits.chatBodyBytesMax, handler: (ctx) => serveTokenize(ctx, engine, policies),
    },
    {
      ...base,
      method: 'POST',
      path: '/detokenize',
      doc: { summary: 'The text of token ids (vLLM)', tag: 'tokenize', body: DetokenizeRequest, responses: { 200: DetokenizeResponse } },
      bodyBytesMax: limits.chatBodyBytesMax, handler: (ctx) => serveDetokenize(ctx, engine, policies),
    },
  ];
}
