import type { Sql, Tx } from '../db/index.js';
import { ApiError, invalid, notFound } from '../errors.js';
import { newId } from '../ids.js';
import { log } from '../log.js';
import { postTransaction } from './ledger.js';
import type { CreateRunBody, RecordUsageBody } from './protocol.js';
import { isMember, teamsOf } from '../auth/membership.js';

// RFT runs (SPEC 2.6, 4.5): a pricing snapshot taken at creation and usage
// records. Usage comes two ways: admin records (training tokens, and inference
// run outside this gateway), charged to the run's wallet at the run's prices;
// and gateway inference carrying `X-RFT-Run-ID`, already charged per token by
// the inference charger at the model's prices, so only counted here.
//
// Arithmetic is exact: prices are integer micro-USD per million tokens, so a
// cost is tokens x price_micro / 10^12 USD, computed in integers and rounded
// once, when it becomes a JSON number.

const MICRO = 1_000_000;
/** Ledger units (USD x 10^4) per tokens x price_micro (USD x 10^12 / 10^6 tokens): 10^12 / 10^4. */
const NUMERATOR_PER_UNIT = 100_000_000n;

export interface RunUsage {
  runId: string;
  input: number;
  output: number;
}

interface RunRow {
  id: string;
  name: string;
  base_model: string;
  status: string;
  user_id: string;
  team_id: string | null;
  wallet_id: string;
  training_price_micro: number;
  inference_input_price_micro: number;
  inference_output_price_micro: number;
  created_at: Date;
  updated_at: Date;
}

const toMicro = (usdPerMTok: number) => Math.round(usdPerMTok * MICRO);

/** An exact amount in USD x 10^12 as the nearest JSON number. */
function usd12(n: bigint): number {
  const neg = n < 0n;
  const s = (neg ? -n : n).toString().padStart(13, '0');
  const v = Number(`${s.slice(0, -12)}.${s.slice(-12)}`);
  return neg ? -v : v;
}

function pricing(r: RunRow) {
  return {
    training_per_mtok: r.training_price_micro / MICRO,
    inference_input_per_mtok: r.inference_input_price_micro / MICRO,
    inference_output_per_mtok: r.inference_output_price_micro / MICRO,
  };
}

function runRecord(r: RunRow) {
  return {
    id: r.id,
    name: r.name,
    baseModel: r.base_model,
    status: r.status,
    userId: r.user_id,
    teamId: r.team_id,
    walletId: r.wallet_id,
    pricing: pricing(r),
    createdAt: r.created_at.toISOString(),
    updatedAt: r.updated_at.toISOString(),
  };
}

export async function createRun(sql: Sql, b: CreateRunBody) {
  const [user] = await sql`SELECT 1 FROM users WHERE id = ${b.userId}`;
  if (!user) throw new ApiError('not_found', `userId: no user ${JSON.stringify(b.userId)}`, { param: 'userId' });
  let walletQuery = sql<{ id: string }[]>`SELECT id FROM wallets WHERE user_id = ${b.userId}`;
  if (b.teamId) {
    const [team] = await sql`SELECT 1 FROM teams WHERE id = ${b.teamId}`;
    if (!team) throw new ApiError('not_found', `teamId: no team ${JSON.stringify(b.teamId)}`, { param: 'teamId' });
    if (!(await isMember(sql, b.teamId, b.userId))) throw invalid('teamId', `user ${b.userId} is not a member of this team`, b.teamId);
    walletQuery = sql<{ id: string }[]>`SELECT id FROM wallets WHERE team_id = ${b.teamId}`;
  }
  const [wallet] = await walletQuery;
  const p = b.pricing;
  const [row] = await sql<RunRow[]>`
    INSERT INTO rft_runs (id, name, base_model, status, user_id, team_id, wallet_id,
                          training_price_micro, inference_input_price_micro, inference_output_price_micro)
    VALUES (${newId()}, ${b.name}, ${b.baseModel}, ${b.status ?? 'RUNNING'}, ${b.userId}, ${b.teamId ?? null}, ${wallet!.id},
            ${toMicro(p.training_per_mtok)}, ${toMicro(p.inference_input_per_mtok)}, ${toMicro(p.inference_output_per_mtok)})
    RETURNING *`;
  return runRecord(row!);
}

export async function setRunStatus(sql: Sql, runId: string, status: string) {
  const [row] = await sql<RunRow[]>`UPDATE rft_runs SET status = ${status}, updated_at = now() WHERE id = ${runId} RETURNING *`;
  if (!row) throw notFound('run', runId);
  return runRecord(row);
}

/**
 * An admin usage record: counted, and charged to the run's wallet at the run's
 * prices. The ledger follows the exact running total: it holds
 * floor(sum(tokens x price_micro) / 10^8) units, so rounding never adds up.
 * Locks wallet then run, the order every writer of both uses.
 */
export async function recordAdminUsage(sql: Sql, runId: string, b: RecordUsageBody) {
  const training = b.trainingTokens ?? 0;
  const input = b.inputTokens ?? 0;
  const output = b.outputTokens ?? 0;
  await sql.begin(async (tx) => {
    const [run] = await tx<RunRow[]>`SELECT * FROM rft_runs WHERE id = ${runId}`;
    if (!run) throw notFound('run', runId);
    await tx`SELECT 1 FROM wallets WHERE id = ${run.wallet_id} FOR UPDATE`;
    const [before] = await tx<{ charged_units: number }[]>`SELECT charged_units FROM rft_runs WHERE id = ${runId} FOR NO KEY UPDATE`;
    await tx`
      INSERT INTO rft_usage (run_id, source, training_tokens, input_tokens, output_tokens)
      VALUES (${runId}, 'admin', ${training}, ${input}, ${output})`;
    const add =
      BigInt(training) * BigInt(run.training_price_micro) +
      BigInt(input) * BigInt(run.inference_input_price_micro) +
      BigInt(output) * BigInt(run.inference_output_price_micro);
    const [after] = await tx<{ charged_units: number }[]>`
      UPDATE rft_runs SET billed_numerator = billed_numerator + ${add.toString()}::numeric,
             charged_units = floor((billed_numerator + ${add.toString()}::numeric) / ${NUMERATOR_PER_UNIT.toString()}::numeric),
             updated_at = now()
      WHERE id = ${runId} RETURNING charged_units`;
    const units = after!.charged_units - before!.charged_units;
    if (units > 0) {
      await postTransaction(tx, {
        walletId: run.wallet_id,
        amount: -units,
        type: 'TRAINING_CHARGE',
        description: `RFT run ${run.name}: ${training} training, ${input} input, ${output} output tokens`,
        refType: 'rft_run',
        refId: runId,
      });
    }
  });
  return runUsage(sql, runId, null);
}

/**
 * Counts gateway inference against runs, inside the inference charger's
 * transaction (src/money/inference-charges.ts). Unknown run ids are dropped:
 * the header is the caller's word, and one bad id must not fail the batch
 * that charges everybody's tokens.
 */
export async function recordRunUsageTx(tx: Tx, runs: RunUsage[]): Promise<number> {
  const live = runs.filter((r) => r.input + r.output > 0);
  if (!live.length) return 0;
  const res = await tx`
    INSERT INTO rft_usage (run_id, source, input_tokens, output_tokens)
    SELECT v.run_id, 'gateway', v.input, v.output
    FROM unnest(${live.map((r) => r.runId)}::text[], ${live.map((r) => r.input)}::bigint[], ${live.map((r) => r.output)}::bigint[])
         AS v(run_id, input, output)
    JOIN rft_runs r ON r.id = v.run_id`;
  if (res.count < live.length) log.warn({ unknown: live.length - res.count }, 'inference usage named RFT runs that do not exist; not counted');
  return res.count;
}

/** Whether `userId` may read the run (its owner, or a member of its team). For the gateway's header check. */
export async function runVisibleTo(sql: Sql | Tx, runId: string, userId: string): Promise<boolean> {
  const [r] = await sql`
    SELECT 1 FROM rft_runs r WHERE r.id = ${runId}
      AND (r.user_id = ${userId} OR r.team_id IN (${teamsOf(sql, userId)}))`;
  return !!r;
}

/**
 * SPEC 2.6: totals over the run's records at its snapshot prices. `viewer`
 * null reads any run (admin); otherwise a run the viewer cannot read is 404.
 */
export async function runUsage(sql: Sql, runId: string, viewer: string | null) {
  const [r] = await sql<(RunRow & { record_count: number; training: number; input: number; output: number })[]>`
    SELECT r.*, count(u.id)::int AS record_count, COALESCE(sum(u.training_tokens), 0)::bigint AS training,
           COALESCE(sum(u.input_tokens), 0)::bigint AS input, COALESCE(sum(u.output_tokens), 0)::bigint AS output
    FROM rft_runs r LEFT JOIN rft_usage u ON u.run_id = r.id
    WHERE r.id = ${runId}
      ${viewer === null ? sql`` : sql`AND (r.user_id = ${viewer} OR r.team_id IN (${teamsOf(sql, viewer)}))`}
    GROUP BY r.id`;
  if (!r) throw notFound('run', runId);
  const trainingCost = BigInt(r.training) * BigInt(r.training_price_micro);
  const inferenceCost = BigInt(r.input) * BigInt(r.inference_input_price_micro) + BigInt(r.output) * BigInt(r.inference_output_price_micro);
  return {
    run_id: r.id,
    run_name: r.name,
    base_model: r.base_model,
    status: r.status,
    training: { tokens: r.training, input_tokens: 0, output_tokens: 0, cost_usd: usd12(trainingCost) },
    inference: { tokens: r.input + r.output, input_tokens: r.input, output_tokens: r.output, cost_usd: usd12(inferenceCost) },
    total_tokens: r.training + r.input + r.output,
    total_cost_usd: usd12(trainingCost + inferenceCost),
    pricing: pricing(r),
    record_count: r.record_count,
  };
}
