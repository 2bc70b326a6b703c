import { ApiError } from '../errors.js';
import type { Route } from '../http/router.js';
import type { ServedModel } from './engine-api.js';
import type { Policies } from './policy-api.js';
import type { ModelObject } from './protocol.js';
import { serveChat, type ChatEngine } from './serving-chat.js';
import { serveEvaluation } from './serving-eval.js';
import type { EvalEngine } from './evaluator/evaluate.js';

export interface InferenceEngine extends ChatEngine, EvalEngine {
  list(): ServedModel[];
}

export interface InferenceLimits {
  chatBodyBytesMax: number;
  evalBodyBytesMax: number;
  streamTimeoutMs: number;
}

const modelObject = (m: ServedModel): ModelObject => ({ id: m.id, object: 'model', created: m.created, owned_by: m.ownedBy });

export function inferenceRoutes(engine: InferenceEngine, policies: Policies, limits: InferenceLimits): Route[] {
  const base = { family: 'inference' as const, auth: 'inference:use' };
  // The model list is fixed after start: serialise it once.
  const listBody = JSON.stringify({ object: 'list', data: engine.list().map(modelObject) });
  const evalRoute = (path: string, gateway: boolean): Route => ({
    ...base,
    method: 'POST',
    path,
    bodyBytesMax: limits.evalBodyBytesMax,
    handler: (ctx) => serveEvaluation(ctx, engine, policies, gateway),
  });
  return [
    { ...base, method: 'GET', path: '/api/v1/models', handler: (ctx) => ({ raw: listBody, headers: policies.admitLight(ctx) }) },
    {
      ...base,
      method: 'GET',
      path: '/api/v1/models/*modelId',
      handler: (ctx) => {
        const m = engine.model(ctx.params.modelId!);
        if (!m) throw new ApiError('not_found', `model ${JSON.stringify(ctx.params.modelId)} does not exist`, { param: 'model', code: 'model_not_found' });
        return { body: modelObject(m), headers: policies.admitLight(ctx) };
      },
    },
    {
      ...base,
      method: 'POST',
      path: '/api/v1/chat/completions',
      bodyBytesMax: limits.chatBodyBytesMax,
      // Streams and long generations end by their own deadline, not the default one.
      timeoutMs: limits.streamTimeoutMs,
      handler: (ctx) => serveChat(ctx, engine, policies),
    },
    evalRoute('/api/v1/evaluations', false),
    evalRoute('/v4/ai/evaluation-model', true),
  ];
}
