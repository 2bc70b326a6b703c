import { z } from 'zod';
import { idString } from '../http/validate.js';

// Request schemas of the money routes: admin top-up (SPEC 4.7), invoices,
// RFT runs and their usage (admin extensions, docs/api-notes/money.md).
// Null means absent; unknown keys are dropped.

/** 100 million USD in units: no single credit is larger; sums stay far inside 2^53. */
export const AMOUNT_UNITS_MAX = 1_000_000_000_000;
/** Descriptions land in the ledger and in lists: a sentence, not a document. */
export const DESCRIPTION_CHARS_MAX = 500;
/** Stripe allows 255 characters for an idempotency key; so do we. */
export const IDEMPOTENCY_KEY_CHARS_MAX = 255;
/** Tokens in one usage record: 10^12 is more than any run uses, and keeps tokens x price_micro exact in numeric. */
export const TOKENS_PER_RECORD_MAX = 1_000_000_000_000;
/** Prices per million tokens: at most 10000 USD, with at most 6 decimals (stored as micro-USD). */
export const PRICE_PER_MTOK_MAX = 10_000;
export const PRICE_DECIMALS_MAX = 6;
export const RUN_STATUSES = ['PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'STOPPED'] as const;

const id = idString;
const description = z.string('must be a string').max(DESCRIPTION_CHARS_MAX, `must be at most ${DESCRIPTION_CHARS_MAX} characters`);

export const TopupBody = z.object({
  amount: z
    .number('must be an integer number of units (USD x 10000)')
    .int('must be an integer number of units (USD x 10000)')
    .min(1, 'must be a positive integer number of units (USD x 10000)')
    .max(AMOUNT_UNITS_MAX, `must be at most ${AMOUNT_UNITS_MAX} units`),
  userId: id.nullish(),
  teamId: id.nullish(),
  type: z.enum(['TOPUP', 'REFUND'], 'must be TOPUP (credit) or REFUND (debit); other transaction types cannot be created here'),
  description: description.nullish(),
});
export type TopupBody = z.infer<typeof TopupBody>;

const price = z
  .number('must be a number (USD per million tokens)')
  .min(0, 'must be at least 0')
  .max(PRICE_PER_MTOK_MAX, `must be at most ${PRICE_PER_MTOK_MAX}`)
  .refine((v) => Math.abs(v * 10 ** PRICE_DECIMALS_MAX - Math.round(v * 10 ** PRICE_DECIMALS_MAX)) < 1e-6, `must have at most ${PRICE_DECIMALS_MAX} decimals`);

export const CreateRunBody = z.object({
  name: z.string('must be a string').trim().min(1, 'must not be empty').max(255, 'must be at most 255 characters'),
  baseModel: z.string('must be a string').trim().min(1, 'must not be empty').max(255, 'must be at most 255 characters'),
  userId: id,
  teamId: id.nullish(),
  status: z.enum(RUN_STATUSES, `must be one of ${RUN_STATUSES.join(', ')}`).nullish(),
  pricing: z.object(
    {
      training_per_mtok: price,
      inference_input_per_mtok: price,
      inference_output_per_mtok: price,
    },
    'must be an object {training_per_mtok, inference_input_per_mtok, inference_output_per_mtok}',
  ),
});
export type CreateRunBody = z.infer<typeof CreateRunBody>;

export const PatchRunBody = z.object({
  status: z.enum(RUN_STATUSES, `must be one of ${RUN_STATUSES.join(', ')}`),
});

const tokens = z
  .number('must be an integer')
  .int('must be an integer')
  .min(0, 'must be at least 0')
  .max(TOKENS_PER_RECORD_MAX, `must be at most ${TOKENS_PER_RECORD_MAX}`);

export const RecordUsageBody = z
  .object({
    trainingTokens: tokens.nullish(),
    inputTokens: tokens.nullish(),
    outputTokens: tokens.nullish(),
  })
  .refine((b) => (b.trainingTokens ?? 0) + (b.inputTokens ?? 0) + (b.outputTokens ?? 0) > 0, {
    message: 'must record at least one token (trainingTokens, inputTokens or outputTokens)',
  });
export type RecordUsageBody = z.infer<typeof RecordUsageBody>;
