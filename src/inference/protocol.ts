import { z } from 'zod';
import type { TokenUsage } from './engine-api.js';

// Request and response types of the inference API (SPEC 4.8-4.10), in one place.

// ---------------------------------------------------------------- chat completions

/** OpenAI allows at most 4 stop sequences; longer lists are a client bug. */
export const STOP_SEQUENCES_MAX = 4;
/** A stop sequence longer than this cannot be matched sensibly against streamed text. */
export const STOP_SEQUENCE_CHARS_MAX = 256;
/** Conversations longer than any context we serve are refused before tokenising. */
export const MESSAGES_MAX = 4096;

const TextPart = z.object({ type: z.literal('text'), text: z.string() });

const Message = z.object({
  role: z.enum(['system', 'developer', 'user', 'assistant', 'tool'], {
    message: 'must be one of system, developer, user, assistant, tool',
  }),
  // OpenAI accepts a string or an array of content parts; only text parts can be served here.
  content: z.union([z.string(), z.array(TextPart, { message: 'must be a string or an array of text parts' })]).nullish(),
  name: z.string().optional(),
  // An assistant turn that called tools, and a tool's answer to one of them.
  tool_calls: z
    .array(z.object({ id: z.string(), type: z.literal('function'), function: z.object({ name: z.string(), arguments: z.string() }) }))
    .nullish(),
  tool_call_id: z.string().nullish(),
});

const stopSeq = z.string().min(1, 'must not be empty').max(STOP_SEQUENCE_CHARS_MAX, `must be at most ${STOP_SEQUENCE_CHARS_MAX} characters`);

/** OpenAI's bound on tools per request. */
export const TOOLS_MAX = 128;
/** OpenAI's bound on top_logprobs for chat completions. */
export const TOP_LOGPROBS_MAX = 20;
/** OpenAI's logit_bias range: -100 bans a token, 100 forces it. */
export const LOGIT_BIAS_ABS_MAX = 100;
/** More biased tokens than this is a client bug (OpenAI documents no bound; 300 is its practical limit). */
export const LOGIT_BIAS_ENTRIES_MAX = 1024;

/** A strict object whose unknown keys are refused with `message` (validate.ts names each key). */
const strictObject = <T extends z.ZodRawShape>(shape: T, message: string) =>
  z.object(shape, { error: (iss) => (iss.code === 'unrecognized_keys' ? message : undefined) }).strict();

/** Sampling and stream parameters shared by chat and legacy completions (same meaning in both). */
const sampling = {
  model: z.string({ message: 'is required and must be a string' }).min(1, 'must not be empty'),
  max_tokens: z.number().int('must be an integer').min(1, 'must be at least 1').nullish(),
  temperature: z.number().min(0, 'must be between 0 and 2').max(2, 'must be between 0 and 2').nullish(),
  top_p: z.number().gt(0, 'must be greater than 0 and at most 1').max(1, 'must be greater than 0 and at most 1').nullish(),
  // vLLM's sampling extras: -1 or 0 turns top_k off (vLLM takes -1, some clients send 0).
  top_k: z.number().int('must be an integer').min(-1, 'must be -1 (off), 0 (off) or a positive integer').nullish(),
  min_p: z.number().min(0, 'must be between 0 and 1').max(1, 'must be between 0 and 1').nullish(),
  // llama.cpp server's: false runs the whole prompt and keeps nothing of it (runtime/kept-prompts.ts); true, the default, may start from a kept one.
  cache_prompt: z.boolean({ message: 'must be true or false' }).nullish(),
  stream: z.boolean().nullish(),
  stream_options: strictObject({ include_usage: z.boolean().nullish() }, 'is not supported; stream_options takes include_usage only').nullish(),
  stop: z
    .union([stopSeq, z.array(stopSeq).max(STOP_SEQUENCES_MAX, `must list at most ${STOP_SEQUENCES_MAX} sequences (OpenAI's limit)`)])
    .nullish(),
  seed: z.number().int('must be an integer').nullish(),
  n: z.literal(1, { message: 'only n=1 is supported' }).nullish(),
  user: z.string().nullish(),
  // Applied over the tokens generated so far, as OpenAI defines them.
  presence_penalty: z.number().min(-2, 'must be between -2 and 2').max(2, 'must be between -2 and 2').nullish(),
  frequency_penalty: z.number().min(-2, 'must be between -2 and 2').max(2, 'must be between -2 and 2').nullish(),
  logit_bias: z
    .record(
      z.string().regex(/^\d{1,9}$/, 'keys must be token ids (non-negative integers as strings)'),
      z.number().min(-LOGIT_BIAS_ABS_MAX, `values must be between -${LOGIT_BIAS_ABS_MAX} and ${LOGIT_BIAS_ABS_MAX}`).max(LOGIT_BIAS_ABS_MAX, `values must be between -${LOGIT_BIAS_ABS_MAX} and ${LOGIT_BIAS_ABS_MAX}`),
    )
    .refine((o) => Object.keys(o).length <= LOGIT_BIAS_ENTRIES_MAX, `must have at most ${LOGIT_BIAS_ENTRIES_MAX} entries`)
    .nullish(),
};
export type SamplingParams = z.infer<z.ZodObject<typeof sampling>>;
const notSupported = (keys: readonly string[]) => `is not a supported parameter; supported: ${keys.join(', ')}`;
const unsupported = (what: string) => `${what} is not supported by this server yet`;

const chat = {
  ...sampling,
  messages: z
    .array(Message, { message: 'is required and must be an array of messages' })
    .min(1, 'must contain at least one message')
    .max(MESSAGES_MAX, `must contain at most ${MESSAGES_MAX} messages`),
  max_completion_tokens: z.number().int('must be an integer').min(1, 'must be at least 1').nullish(),
  // json_schema's schema is compiled to a grammar in the serving layer (grammar/json-schema.ts names any unsupported keyword).
  response_format: z
    .discriminatedUnion(
      'type',
      [
        z.object({ type: z.literal('text') }),
        z.object({ type: z.literal('json_object') }),
        z.object({
          type: z.literal('json_schema'),
          json_schema: z.object({
            name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'must be 1 to 64 letters, digits, _ or -'),
            description: z.string().nullish(),
            schema: z.record(z.string(), z.unknown(), { message: 'must be a JSON schema object' }).nullish(),
            strict: z.boolean().nullish(),
          }),
        }),
      ],
      { message: 'type must be one of text, json_object, json_schema' },
    )
    .nullish(),
  tools: z
    .array(
      z.object({
        type: z.literal('function', { message: 'only function tools exist' }),
        function: z.object({
          name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'must be 1 to 64 letters, digits, _ or -'),
          description: z.string().nullish(),
          parameters: z.record(z.string(), z.unknown()).nullish(),
          strict: z.boolean().nullish(),
        }),
      }),
    )
    .max(TOOLS_MAX, `must list at most ${TOOLS_MAX} tools`)
    .nullish(),
  // "auto" needs a model that decides whether to call a tool; the served models cannot, honestly.
  tool_choice: z
    .union([z.enum(['none', 'required']), z.object({ type: z.literal('function'), function: z.object({ name: z.string() }) })], {
      message: 'must be "none", "required" or {"type": "function", "function": {"name": ...}} ("auto" is not supported: the served models cannot decide whether to call a tool)',
    })
    .nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int('must be an integer').min(0, `must be between 0 and ${TOP_LOGPROBS_MAX}`).max(TOP_LOGPROBS_MAX, `must be between 0 and ${TOP_LOGPROBS_MAX}`).nullish(),
};

/** Any key the chat request does not take is a 400 naming it (never silently ignored). */
export const ChatCompletionRequest = strictObject(chat, notSupported(Object.keys(chat))).superRefine((r, ctx) => {
  if (r.top_logprobs != null && r.logprobs !== true) {
    ctx.addIssue({ code: 'custom', path: ['top_logprobs'], message: 'needs logprobs: true (as OpenAI requires)' });
  }
  const tools = r.tools ?? [];
  const choice = r.tool_choice;
  if (choice && choice !== 'none' && tools.length === 0) ctx.addIssue({ code: 'custom', path: ['tool_choice'], message: 'needs tools to choose from' });
  if (tools.length > 0 && (choice === undefined || choice === null)) {
    ctx.addIssue({ code: 'custom', path: ['tool_choice'], message: 'is required with tools: "required", a named function, or "none" ("auto", the default with tools, is not supported: the served models cannot decide whether to call a tool)' });
  }
  if (typeof choice === 'object' && choice && !tools.some((t) => t.function.name === choice.function.name)) {
    ctx.addIssue({ code: 'custom', path: ['tool_choice', 'function', 'name'], message: `names no listed tool (${tools.map((t) => t.function.name).join(', ')})` });
  }
  if (choice && choice !== 'none' && r.response_format && r.response_format.type !== 'text') {
    ctx.addIssue({ code: 'custom', path: ['response_format'], message: 'cannot be combined with a tool call (its arguments follow the tool\'s parameters)' });
  }
});
export type ChatCompletionRequest = z.infer<typeof ChatCompletionRequest>;

// ---------------------------------------------------------------- legacy completions

/** Prompts in one legacy completions request: each is its own choice, all run at once. */
export const COMPLETION_PROMPTS_MAX = 32;
/** OpenAI's legacy default when max_tokens is absent. */
export const COMPLETION_MAX_TOKENS_DEFAULT = 16;
/** OpenAI's bound on the legacy `logprobs` integer. */
export const COMPLETION_LOGPROBS_MAX = 5;

const tokenIds = z.array(z.number().int('token ids must be integers').min(0, 'token ids must be >= 0'), { message: 'must be a string, an array of strings, an array of token ids or an array of such arrays' });
const completion = {
  ...sampling,
  prompt: z.union(
    [
      z.string(),
      z.array(z.string()).min(1, 'must not be empty').max(COMPLETION_PROMPTS_MAX, `must hold at most ${COMPLETION_PROMPTS_MAX} prompts`),
      tokenIds.min(1, 'must not be empty'),
      z.array(tokenIds.min(1, 'must not be empty')).min(1, 'must not be empty').max(COMPLETION_PROMPTS_MAX, `must hold at most ${COMPLETION_PROMPTS_MAX} prompts`),
    ],
    { message: 'is required: a string, an array of strings, an array of token ids or an array of such arrays' },
  ),
  echo: z.boolean().nullish(),
  logprobs: z.number().int('must be an integer').min(0, `must be between 0 and ${COMPLETION_LOGPROBS_MAX}`).max(COMPLETION_LOGPROBS_MAX, `must be between 0 and ${COMPLETION_LOGPROBS_MAX}`).nullish(),
  best_of: z.literal(1, { message: 'only best_of=1 is supported' }).nullish(),
  suffix: z.null({ message: unsupported('suffix (insertion)') }).optional(),
};
export const CompletionRequest = strictObject(completion, notSupported(Object.keys(completion))).superRefine((r, ctx) => {
  // Echoed prompt tokens would need the prompt's own logprobs, which a prefill does not keep.
  if (r.echo && r.logprobs != null) ctx.addIssue({ code: 'custom', path: ['echo'], message: `${unsupported('echo together with logprobs')}; send one of them` });
});
export type CompletionRequest = z.infer<typeof CompletionRequest>;

// ---------------------------------------------------------------- answers
// Response schemas: the handlers' types are inferred from them, /openapi.json is generated
// from them, and the end-to-end suite checks every answer against them.

export const LegacyLogprobs = z.object({
  tokens: z.array(z.string()),
  token_logprobs: z.array(z.number()),
  top_logprobs: z.array(z.record(z.string(), z.number())),
  text_offset: z.array(z.number().int()),
});
export type LegacyLogprobs = z.infer<typeof LegacyLogprobs>;

export const FinishReason = z.enum(['stop', 'length', 'tool_calls']);
export type FinishReason = z.infer<typeof FinishReason>;

export const Usage = z.object({
  prompt_tokens: z.number().int(),
  completion_tokens: z.number().int(),
  total_tokens: z.number().int(),
  /** OpenAI's: of prompt_tokens, those taken from a kept cache (runtime/kept-prompts.ts) instead of run; billed as the rest. */
  prompt_tokens_details: z.object({ cached_tokens: z.number().int() }).optional(),
});
export type Usage = z.infer<typeof Usage>;
/** The daemon's usage in OpenAI's shape. */
export const openAiUsage = (u: TokenUsage): Usage => ({
  prompt_tokens: u.inputTokens,
  completion_tokens: u.outputTokens,
  total_tokens: u.inputTokens + u.outputTokens,
  prompt_tokens_details: { cached_tokens: u.cachedInputTokens ?? 0 },
});

/** The fields every OpenAI answer object starts with. */
const answerHead = <O extends string>(object: O) => ({
  id: z.string(),
  object: z.literal(object),
  created: z.number().int(),
  model: z.string(),
  system_fingerprint: z.string().nullable(),
});

export const Completion = z.object({
  ...answerHead('text_completion'),
  choices: z.array(z.object({ index: z.number().int(), text: z.string(), logprobs: LegacyLogprobs.nullable(), finish_reason: FinishReason.nullable() })),
  usage: Usage.nullish(),
});
export type Completion = z.infer<typeof Completion>;

const TopLogprob = z.object({ token: z.string(), logprob: z.number(), bytes: z.array(z.number().int()).nullable() });
/** OpenAI's per-token logprob item. */
export const LogprobItem = TopLogprob.extend({ top_logprobs: z.array(TopLogprob) });
export type LogprobItem = z.infer<typeof LogprobItem>;
export const ChoiceLogprobs = z.object({ content: z.array(LogprobItem), refusal: z.null() }).nullable();
export type ChoiceLogprobs = z.infer<typeof ChoiceLogprobs>;

export const ToolCall = z.object({ id: z.string(), type: z.literal('function'), function: z.object({ name: z.string(), arguments: z.string() }) });
export type ToolCall = z.infer<typeof ToolCall>;

export const ChatCompletion = z.object({
  ...answerHead('chat.completion'),
  choices: z.array(
    z.object({
      index: z.number().int(),
      message: z.object({ role: z.literal('assistant'), content: z.string().nullable(), tool_calls: z.array(ToolCall).optional() }),
      finish_reason: FinishReason,
      logprobs: ChoiceLogprobs,
    }),
  ),
  usage: Usage,
});
export type ChatCompletion = z.infer<typeof ChatCompletion>;

export const ChatCompletionChunk = z.object({
  ...answerHead('chat.completion.chunk'),
  choices: z.array(
    z.object({
      index: z.number().int(),
      delta: z.object({
        role: z.literal('assistant').optional(),
        content: z.string().nullish(),
        tool_calls: z
          .array(z.object({ index: z.number().int(), id: z.string().optional(), type: z.literal('function').optional(), function: z.object({ name: z.string().optional(), arguments: z.string() }) }))
          .optional(),
      }),
      finish_reason: FinishReason.nullable(),
      logprobs: ChoiceLogprobs,
    }),
  ),
  usage: Usage.nullish(),
});
export type ChatCompletionChunk = z.infer<typeof ChatCompletionChunk>;

// ---------------------------------------------------------------- models

export const ModelObject = z.object({
  id: z.string(),
  object: z.literal('model'),
  created: z.number().int(),
  owned_by: z.string(),
  /** vLLM's field: the context length, prompt and completion together. */
  max_model_len: z.number().int().describe('the context length, prompt and completion together (vLLM)'),
  /** `chat` (chat and completions) or `evaluation` (typed evaluations only). */
  kind: z.enum(['chat', 'evaluation']).describe('chat: chat and completions; evaluation: typed evaluations only'),
});
export type ModelObject = z.infer<typeof ModelObject>;
export const ModelList = z.object({ object: z.literal('list'), data: z.array(ModelObject) });

// ---------------------------------------------------------------- tokenize (vLLM's shapes)

/** Token ids per detokenize request: a whole context of the largest model we would serve. */
export const DETOKENIZE_TOKENS_MAX = 131_072;

export const TokenizeText = strictObject(
  {
    model: z.string({ message: 'is required and must be a string' }).min(1, 'must not be empty'),
    prompt: z.string({ message: 'must be a string' }),
    add_special_tokens: z.boolean().nullish(),
    return_token_strs: z.boolean().nullish(),
  },
  'is not a supported parameter; tokenize takes model, prompt or messages, add_special_tokens, add_generation_prompt, return_token_strs',
);

export const TokenizeChat = strictObject(
  {
    model: z.string({ message: 'is required and must be a string' }).min(1, 'must not be empty'),
    messages: z.array(Message, { message: 'must be an array of messages' }).min(1, 'must contain at least one message').max(MESSAGES_MAX, `must contain at most ${MESSAGES_MAX} messages`),
    add_generation_prompt: z.literal(true, { message: 'only true is supported (the chat template always ends with the assistant turn)' }).nullish(),
    return_token_strs: z.boolean().nullish(),
  },
  'is not a supported parameter; tokenize takes model, prompt or messages, add_special_tokens, add_generation_prompt, return_token_strs',
);

/** `/tokenize` takes a prompt or chat messages (one of the two shapes). */
export const TokenizeRequest = z.union([TokenizeText, TokenizeChat]);
export const TokenizeResponse = z.object({
  count: z.number().int(),
  max_model_len: z.number().int(),
  tokens: z.array(z.number().int()),
  token_strs: z.array(z.string()).nullable(),
});

export const DetokenizeRequest = z.object({
  model: z.string({ message: 'is required and must be a string' }).min(1, 'must not be empty'),
  tokens: z.array(z.number().int('must be integers').min(0, 'must be token ids (>= 0)')).max(DETOKENIZE_TOKENS_MAX, `must have at most ${DETOKENIZE_TOKENS_MAX} tokens`),
});
export const DetokenizeResponse = z.object({ prompt: z.string() });

// ---------------------------------------------------------------- evaluations

/** SPEC 8: 1 to 64 questions per request. */
export const QUESTIONS_MAX = 64;
/** SPEC 4.10: question ids up to 100 characters of letters, digits, `_`, `.`, `-`. */
export const QUESTION_ID_CHARS_MAX = 100;
export const QUESTION_ID_RE = /^[A-Za-z0-9_.-]+$/;
/** SPEC 8: choice options 1 to 255; score criteria 2 to 10. */
export const CHOICE_OPTIONS_MAX = 255;
export const SCORE_CRITERIA_MIN = 2;
export const SCORE_CRITERIA_MAX = 10;
/** SPEC 8: up to 4 images, 4 MiB each decoded, 8 MiB together. */
export const IMAGES_MAX = 4;
export const IMAGE_BYTES_MAX = 4 * 1024 * 1024;
export const IMAGES_TOTAL_BYTES_MAX = 8 * 1024 * 1024;

const jsonValue: z.ZodType<unknown> = z.unknown().refine((v) => v !== undefined, 'is required');
/** Descriptions and instructions: a string or any JSON value (the AI SDK sends either). */
const description = z.union([z.string(), z.array(z.unknown()), z.record(z.string(), z.unknown())], {
  message: 'must be a string or a JSON object or array',
});

const BooleanQuestion = z
  .object({
    type: z.literal('boolean'),
    instructions: description.nullish(),
    criteria: z
      .record(z.string(), description.nullish())
      .superRefine((o, ctx) => {
        for (const k of Object.keys(o)) {
          if (k !== 'true' && k !== 'false') ctx.addIssue({ code: 'custom', path: [k], message: 'boolean criteria may only have the keys "true" and "false"' });
        }
      })
      .nullish(),
  });

const ChoiceQuestion = z
  .object({
    type: z.literal('choice'),
    instructions: description.nullish(),
    criteria: z
      .record(z.string().min(1, 'option names must not be empty'), description.nullable(), {
        message: 'is required: an object mapping option names to descriptions (or null)',
      })
      .refine((o) => Object.keys(o).length >= 1, 'must have at least 1 option')
      .refine((o) => Object.keys(o).length <= CHOICE_OPTIONS_MAX, `must have at most ${CHOICE_OPTIONS_MAX} options`),
  });

const ScoreQuestion = z
  .object({
    type: z.literal('score'),
    instructions: description.nullish(),
    criteria: z
      .array(description, { message: 'is required: an array of level descriptions, lowest first' })
      .min(SCORE_CRITERIA_MIN, `must have at least ${SCORE_CRITERIA_MIN} levels`)
      .max(SCORE_CRITERIA_MAX, `must have at most ${SCORE_CRITERIA_MAX} levels`),
  });

export const Question = z.discriminatedUnion('type', [BooleanQuestion, ChoiceQuestion, ScoreQuestion], {
  message: 'type must be one of boolean, choice, score',
});
export type Question = z.infer<typeof Question>;

export const EvaluationRequest = z.object({
  model: z.string().min(1, 'must not be empty').nullish(),
  state: jsonValue,
  questions: z
    .record(
      z
        .string()
        .max(QUESTION_ID_CHARS_MAX, `question ids must be at most ${QUESTION_ID_CHARS_MAX} characters`)
        .regex(QUESTION_ID_RE, 'question ids may only contain letters, digits, "_", "." and "-"'),
      Question,
      { message: 'is required: an object of questions keyed by id' },
    )
    .refine((q) => Object.keys(q).length >= 1, 'must contain at least 1 question')
    .refine((q) => Object.keys(q).length <= QUESTIONS_MAX, `must contain at most ${QUESTIONS_MAX} questions`),
  images: z.array(z.string({ message: 'images must be data: URL strings' })).max(IMAGES_MAX, `must contain at most ${IMAGES_MAX} images`).nullish(),
  providerOptions: z.record(z.string(), z.unknown()).nullish(),
});
export type EvaluationRequest = z.infer<typeof EvaluationRequest>;

export const Answer = z.discriminatedUnion('type', [
  z.object({ type: z.literal('boolean'), probability: z.number() }),
  z.object({ type: z.literal('choice'), choice: z.string(), probabilities: z.record(z.string(), z.number()) }),
  z.object({ type: z.literal('score'), score: z.number(), probabilities: z.record(z.string(), z.number()) }),
]);
export type Answer = z.infer<typeof Answer>;

/** The AI SDK accepts exactly these four warning shapes. */
export const Warning = z.discriminatedUnion('type', [
  z.object({ type: z.literal('unsupported'), feature: z.string(), details: z.string().optional() }),
  z.object({ type: z.literal('compatibility'), feature: z.string(), details: z.string().optional() }),
  z.object({ type: z.literal('deprecated'), setting: z.string(), message: z.string() }),
  z.object({ type: z.literal('other'), message: z.string() }),
]);
export type Warning = z.infer<typeof Warning>;

export const EvaluationResponse = z.object({
  answers: z.record(z.string(), Answer),
  model: z.string(),
  usage: z.object({ inputTokens: z.number().int(), outputTokens: z.number().int() }),
  warnings: z.array(Warning),
});
export type EvaluationResponse = z.infer<typeof EvaluationResponse>;
