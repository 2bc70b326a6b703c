import { z } from 'zod';
import { pageQuery, qStr } from '../http/query.js';
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

/** The billing resources charges are summed under (ledger.ts CHARGE_RESOURCE; migration 201's backfill maps to the same four). */
export const CHARGE_RESOURCES = ['compute', 'disks', 'inference', 'training'] as const;
const ChargeResource = z.enum(CHARGE_RESOURCES);

/** What an admin top-up may post: a credit or a debit. */
export const TOPUP_TYPES = ['TOPUP', 'REFUND'] as const;

export const TopupBody = z.object({
  amount: z
    .number('must be an integer number of units (USD x 10000)')
    .int('must be an integer number of units (USD x 10000)')
    .min(1, 'must be a positive integer number of units (USD x 10000)')
    .max(AMOUNT_UNITS_MAX, `must be at most ${AMOUNT_UNITS_MAX} units`),
  userId: id.nullish(),
  teamId: id.nullish(),
  type: z.enum(TOPUP_TYPES, 'must be TOPUP (credit) or REFUND (debit); other transaction types cannot be created here'),
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

// ---------------------------------------------------------------- query parameters

/** The Prime CLI asks for 20 billings by default; 100 bounds one answer. */
const BILLINGS_LIMIT_DEFAULT = 20;
const BILLINGS_LIMIT_MAX = 100;

export const WalletQuery = z.object({
  teamId: qStr().describe("a team's wallet (members only); the caller's own otherwise"),
  team_id: qStr().describe('alias of teamId'),
  ...pageQuery(BILLINGS_LIMIT_DEFAULT, BILLINGS_LIMIT_MAX),
});

// ---------------------------------------------------------------- answers
// Response schemas: /openapi.json is generated from them and the end-to-end suite checks
// every answer against them (CHECK_RESPONSE_SCHEMAS). Comments name where each is built.

// =============================================================== money (money/routes.ts)

/**
 * POST /api/admin/transactions/topup: money/topup.ts. Amounts in UNITS (USD x 10000), not USD.
 * Status is always 200 (the route doc also lists 201, but topup() only produces 200; a replay
 * answers the stored status, also 200, with header idempotent-replayed: true).
 */
export const Topup = z.object({
  walletId: z.string(),
  balance: z.number().int(), // units, after the transaction
  amount: z.number().int(), // signed units: positive TOPUP, negative REFUND
  type: z.enum(TOPUP_TYPES),
  transactionId: z.string(),
  description: z.string().nullable(),
  createdAt: z.string(),
});

/** money/invoices.ts record(). Amounts in USD. */
export const InvoiceLine = z.object({
  resourceType: ChargeResource,
  amount: z.number(),
  charges: z.number().int(),
});
export const Invoice = z.object({
  id: z.string(),
  walletId: z.string(),
  providerTransactionId: z.string(), // 'in_' + 24 hex
  transactionId: z.string(),
  status: z.enum(['OPEN', 'PAID', 'VOID']), // CHECK in migrations/201_money.sql
  amount: z.number(),
  currency: z.string(), // 'USD' (column default; never set otherwise)
  periodStart: z.string(),
  periodEnd: z.string(),
  lines: z.array(InvoiceLine),
  createdAt: z.string(),
  paidAt: z.string().nullable(),
  voidedAt: z.string().nullable(),
});
/** GET /api/admin/invoices/:walletId: invoices.ts (bare array inside data, newest period first). */
export const InvoiceList = z.array(Invoice);
/** POST .../cancel: money/routes.ts answers data: {}. */
export const Empty = z.object({});

/** money/rft.ts pricing(): USD per million tokens. */
export const RunPricing = z.object({
  training_per_mtok: z.number(),
  inference_input_per_mtok: z.number(),
  inference_output_per_mtok: z.number(),
});

/** rft.ts runRecord(): create and PATCH. */
export const Run = z.object({
  id: z.string(),
  name: z.string(),
  baseModel: z.string(),
  status: z.enum(RUN_STATUSES),
  userId: z.string(),
  teamId: z.string().nullable(),
  walletId: z.string(),
  pricing: RunPricing,
  createdAt: z.string(),
  updatedAt: z.string(),
});

const TokenBucket = z.object({
  tokens: z.number().int(),
  input_tokens: z.number().int(),
  output_tokens: z.number().int(),
  cost_usd: z.number(),
});

/**
 * rft.ts runUsage(): GET /api/v1/billing/runs/:runId/usage (bare) and
 * POST /api/admin/rft/runs/:runId/usage (enveloped). snake_case keys.
 * training.input_tokens / training.output_tokens are always 0.
 */
export const RunUsage = z.object({
  run_id: z.string(),
  run_name: z.string(),
  base_model: z.string(),
  status: z.enum(RUN_STATUSES),
  training: TokenBucket,
  inference: TokenBucket,
  total_tokens: z.number().int(),
  total_cost_usd: z.number(),
  pricing: RunPricing,
  record_count: z.number().int(),
});

/** money/wallet.ts one billing (charges summed per resource). */
export const WalletBilling = z.object({
  id: z.string(),
  created_at: z.string(),
  updated_at: z.string(), // same value as last_billed_at
  last_billed_at: z.string(),
  amount_usd: z.number(),
  currency: z.string(),
  resource_type: ChargeResource,
  resource_id: z.string(),
});

/** GET /api/v1/billing/wallet: money/wallet.ts. */
export const WalletView = z.object({
  wallet_id: z.string(),
  team_id: z.string().nullable(),
  balance_usd: z.number(),
  currency: z.string(),
  total_billings: z.number().int(),
  recent_billings: z.array(WalletBilling),
});

