import { parentPort } from 'node:worker_threads';
import { ApiError } from '../errors.js';
import { parse } from '../http/validate.js';
import type { ServedModel } from './engine-api.js';
import { checkStateChars } from './evaluator/evaluate.js';
import { prefixText } from './evaluator/prompt.js';
import { ChatCompletionRequest, CompletionRequest, EvaluationRequest } from './protocol.js';
import type { ScreenJob, ScreenResult } from './screen.js';
import { chatChars, chatMessages, checkChars } from './serving-checks.js';

// The screening thread: a large body is parsed, validated and held against its
// model's context here, so that a 16 MiB body that cannot fit is refused without
// the event loop ever holding it (JSON.parse alone is ~100 ms of it).

type Screen = (value: unknown, model: (id: string | undefined) => ServedModel | undefined) => void;

const screens: Record<ScreenJob['kind'], Screen> = {
  chat: (value, model) => {
    const req = parse(ChatCompletionRequest, value);
    const m = model(req.model);
    if (m?.kind === 'chat') checkChars(m, chatChars(chatMessages(req.messages)), 'messages');
  },
  completion: (value, model) => {
    const req = parse(CompletionRequest, value);
    const m = model(req.model);
    const p = req.prompt;
    if (m?.kind !== 'chat') return;
    if (typeof p === 'string') checkChars(m, p.length, 'prompt');
    else p.forEach((x, i) => typeof x === 'string' && checkChars(m, x.length, `prompt.${i}`));
  },
  evaluation: (value, model) => {
    const req = parse(EvaluationRequest, value);
    const m = model(req.model ?? undefined);
    if (m?.kind !== 'evaluation') return;
    // planEvaluation's own refusal, made here before the state is copied back.
    checkStateChars(m, prefixText(req.state));
  },
};

parentPort!.on('message', (job: ScreenJob) => {
  let reply: ScreenResult;
  try {
    let value: unknown;
    try {
      value = JSON.parse(Buffer.from(job.body.buffer, job.body.byteOffset, job.body.byteLength).toString('utf8'));
    } catch (e) {
      throw new ApiError('bad_json', `request body is not valid JSON: ${(e as Error).message}`, { param: 'body' });
    }
    screens[job.kind](value, (id) => job.models.find((m) => m.id === (id ?? job.headerModel)));
    reply = { id: job.id, value };
  } catch (e) {
    const err = e instanceof ApiError ? e : new ApiError('internal', 'internal error while reading the request');
    reply = { id: job.id, error: { kind: err.kind, message: err.message, param: err.param, code: err.code, issues: err.issues } };
  }
  parentPort!.postMessage(reply);
});
