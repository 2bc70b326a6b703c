import { randomUUID } from 'node:crypto';
import { ApiError, invalid, withHeaders } from '../errors.js';
import { log } from '../log.js';
import type { Ctx } from '../http/context.js';
import type { Reply } from '../http/router.js';
import { takeTurn } from '../turns.js';
import { parse } from '../http/validate.js';
import type { InferenceEngine } from './engine-api.js';
import { planEvaluation } from './evaluator/evaluate.js';
import type { Policies } from './policy-api.js';
import { EvaluationRequest, type EvaluationResponse } from './protocol.js';
import type { BodyScreen } from './screen.js';
import { resolveModel } from './serving-checks.js';

/** The gateway protocol's version this server speaks (Evaluation Model V4). */
const SPEC_VERSION = '4';

/**
 * POST /api/v1/evaluations and POST /v4/ai/evaluation-model: one shared
 * prefill of the state, every question a branch of it, answers as
 * probabilities. Every answer, errors included, carries X-Inference-Id.
 */
export async function serveEvaluation(
  ctx: Ctx,
  engine: InferenceEngine,
  policies: Policies,
  screen: BodyScreen,
  gateway: boolean,
): Promise<Reply> {
  const inferenceId = `eval-${randomUUID()}`;
  ctx.note({ inferenceId, stream: false });
  try {
    const body = await screen.json(ctx, 'evaluation');
    await takeTurn(); // parsing, planning and admission: one request a turn (src/turns.ts)
    const req = parse(EvaluationRequest, body);
    const modelId = req.model ?? (gateway ? ctx.header('ai-model-id') : undefined);
    if (!modelId) throw invalid('model', gateway ? 'is required, in the body or in the ai-model-id header' : 'is required', req.model);
    const model = resolveModel(engine, modelId, 'evaluation');
    ctx.note({ model: model.id });
    await policies.check(ctx);
    const plan = await planEvaluation(engine, model, req);
    const version = ctx.header('ai-evaluation-model-specification-version');
    if (version !== undefined && version !== SPEC_VERSION) {
      plan.warnings.push({ type: 'compatibility', feature: 'ai-evaluation-model-specification-version', details: `requested ${version}; answered as version ${SPEC_VERSION}` });
    }
    const admission = await policies.admit(ctx, model, plan.tokens);
    let processed = 0;
    try {
      const out = await engine.scoreBranches(model.id, { prefixTokens: plan.prefixTokens, branches: plan.branches, signal: ctx.signal, shareScope: ctx.principal.userId });
      processed = out.processedTokens;
      const result = plan.finish(out.logprobs, out.processedTokens);
      const body: EvaluationResponse = { answers: result.answers, model: model.id, usage: result.usage, warnings: result.warnings };
      return { body, headers: { ...admission.headers, 'x-inference-id': inferenceId } };
    } finally {
      ctx.note({ promptTokens: processed, completionTokens: 0 });
      admission.settle({ inputTokens: processed, outputTokens: 0 });
    }
  } catch (e) {
    if (!(e instanceof ApiError)) log.error({ reqId: ctx.requestId, inferenceId, err: e }, 'evaluation failed');
    const err = e instanceof ApiError ? e : new ApiError('internal', 'internal error while evaluating; quote the X-Inference-Id to support');
    throw withHeaders(err, { 'x-inference-id': inferenceId });
  }
}
