import type { z } from 'zod';
import { DB_BULK_WAIT_MS, withWait } from '../db/bounded.js';
import { ApiError, conflict, invalid, notFound } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';
import { iso } from '../format.js';
import type { CreateEvaluationBody, UpdateEvaluationBody } from './protocol.js';
import { isMember, teamsOf } from '../auth/membership.js';

// Evaluation records (SPEC 4.6; DESIGN.md "Evaluation records"): a client
// creates a record, pushes samples in batches (four at a time), then finalizes
// it. Samples are stored as pushed (JSONB), numbered in arrival order; pushes to
// one record serialise on its row lock, and a finalized record takes no more.

const PENDING = 'PENDING';
const COMPLETED = 'COMPLETED';

interface EvalRow {
  id: string;
  user_id: string;
  team_id: string | null;
  name: string;
  status: string;
  eval_type: string;
  environments: unknown[] | null;
  suite_id: string | null;
  run_id: string | null;
  model_name: string | null;
  dataset: string | null;
  framework: string | null;
  task_type: string | null;
  description: string | null;
  tags: string[];
  metadata: Record<string, unknown> | null;
  metrics: Record<string, unknown> | null;
  is_public: boolean;
  total_samples: number;
  created_at: Date;
  updated_at: Date;
  finalized_at: Date | null;
  total_count?: number;
}

function record(e: EvalRow) {
  const envs = (e.environments ?? []) as { id?: unknown }[];
  return {
    evaluation_id: e.id,
    id: e.id,
    name: e.name,
    status: e.status,
    eval_type: e.eval_type,
    user_id: e.user_id,
    team_id: e.team_id,
    environments: e.environments,
    environment_ids: e.environments ? envs.map((x) => (typeof x.id === 'string' ? x.id : null)).filter((x) => x !== null) : null,
    suite_id: e.suite_id,
    run_id: e.run_id,
    model_name: e.model_name,
    dataset: e.dataset,
    framework: e.framework,
    task_type: e.task_type,
    description: e.description,
    tags: e.tags,
    metadata: e.metadata,
    metrics: e.metrics ?? {},
    is_public: e.is_public,
    total_samples: e.total_samples,
    created_at: iso(e.created_at),
    updated_at: iso(e.updated_at),
    finalized_at: iso(e.finalized_at),
  };
}

const visible = (sql: Sql | Tx, userId: string) =>
  sql`(e.user_id = ${userId} OR e.team_id IN (${teamsOf(sql, userId)}))`;

export async function createEvaluation(sql: Sql, userId: string, b: z.infer<typeof CreateEvaluationBody>) {
  if (b.team_id && !(await isMember(sql, b.team_id, userId))) {
    throw new ApiError('forbidden', `team_id: you are not a member of team ${JSON.stringify(b.team_id)}`, { param: 'team_id' });
  }
  const evalType = b.run_id ? 'training' : b.suite_id ? 'suite' : 'environment';
  const j = (v: unknown) => (v === null || v === undefined ? null : sql.json(v as never));
  const [e] = await sql<EvalRow[]>`
    INSERT INTO evaluations (id, user_id, team_id, name, status, eval_type, environments, suite_id, run_id, model_name, dataset, framework,
                             task_type, description, tags, metadata, metrics, is_public)
    VALUES (${newId()}, ${userId}, ${b.team_id ?? null}, ${b.name}, ${PENDING}, ${evalType}, ${j(b.environments)}, ${b.suite_id ?? null},
            ${b.run_id ?? null}, ${b.model_name ?? null}, ${b.dataset ?? null}, ${b.framework ?? null}, ${b.task_type ?? null},
            ${b.description ?? null}, ${b.tags ?? []}, ${j(b.metadata)}, ${j(b.metrics)}, ${b.is_public ?? false})
    RETURNING *`;
  return record(e!);
}

export async function getEvaluation(sql: Sql, userId: string, id: string) {
  const [e] = await sql<EvalRow[]>`SELECT e.* FROM evaluations e WHERE e.id = ${id} AND ${visible(sql, userId)}`;
  if (!e) throw notFound('evaluation', id);
  return record(e);
}

export async function listEvaluations(sql: Sql, userId: string, teamId: string | undefined, skip: number, limit: number) {
  if (teamId && !(await isMember(sql, teamId, userId))) throw notFound('team', teamId);
  const where = teamId ? sql`e.team_id = ${teamId}` : sql`e.user_id = ${userId}`;
  const rows = await sql<EvalRow[]>`
    SELECT e.*, count(*) OVER ()::int AS total_count FROM evaluations e WHERE ${where}
    ORDER BY e.created_at DESC, e.id LIMIT ${limit} OFFSET ${skip}`;
  let total = rows[0]?.total_count;
  if (total === undefined) {
    const [c] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM evaluations e WHERE ${where}`;
    total = c!.n;
  }
  return { evaluations: rows.map(record), total, skip, limit };
}

/**
 * PUT: replaces the fields sent (see UpdateEvaluationBody). Allowed on a
 * finalized record too: renaming or tagging a finished run changes no result.
 */
export async function updateEvaluation(sql: Sql, userId: string, id: string, b: UpdateEvaluationBody) {
  const j = (v: unknown) => (v === null || v === undefined ? null : sql.json(v as never));
  const has = (k: keyof UpdateEvaluationBody) => b[k] !== undefined;
  const [e] = await sql<EvalRow[]>`
    UPDATE evaluations e SET
      name = CASE WHEN ${has('name')} THEN ${b.name ?? null} ELSE e.name END,
      model_name = CASE WHEN ${has('model_name')} THEN ${b.model_name ?? null} ELSE e.model_name END,
      dataset = CASE WHEN ${has('dataset')} THEN ${b.dataset ?? null} ELSE e.dataset END,
      framework = CASE WHEN ${has('framework')} THEN ${b.framework ?? null} ELSE e.framework END,
      task_type = CASE WHEN ${has('task_type')} THEN ${b.task_type ?? null} ELSE e.task_type END,
      description = CASE WHEN ${has('description')} THEN ${b.description ?? null} ELSE e.description END,
      tags = CASE WHEN ${has('tags')} THEN ${b.tags ?? []}::text[] ELSE e.tags END,
      metadata = CASE WHEN ${has('metadata')} THEN ${j(b.metadata)}::jsonb ELSE e.metadata END,
      metrics = CASE WHEN ${has('metrics')} THEN ${j(b.metrics)}::jsonb ELSE e.metrics END,
      updated_at = now()
    WHERE e.id = ${id} AND ${visible(sql, userId)}
    RETURNING e.*`;
  if (!e) throw notFound('evaluation', id);
  return record(e);
}

/** Locks a record the caller may write and refuses one that is finalized. */
async function lockOpen(tx: Tx, userId: string, id: string): Promise<EvalRow> {
  const [e] = await tx<EvalRow[]>`SELECT e.* FROM evaluations e WHERE e.id = ${id} AND ${visible(tx, userId)} FOR UPDATE OF e`;
  if (!e) throw notFound('evaluation', id);
  if (e.status !== PENDING) throw conflict(`evaluation ${id} is ${e.status}; a finalized evaluation takes no more samples`, 'evaluation_id');
  return e;
}

/**
 * Appends a batch. `rawBody` is the request body as sent: PostgreSQL extracts
 * the samples from it, so a 25 MiB batch is not serialised a second time.
 */
export async function pushSamples(sql: Sql, userId: string, id: string, count: number, rawBody: string) {
  try {
    return await withWait(sql, DB_BULK_WAIT_MS).begin(async (tx) => {
      const e = await lockOpen(tx, userId, id);
      if (count > 0) {
        await tx`
          INSERT INTO evaluation_samples (evaluation_id, seq, data)
          SELECT ${id}, ${e.total_samples} + t.ord - 1, t.elem
          FROM jsonb_array_elements(${rawBody}::text::jsonb -> 'samples') WITH ORDINALITY AS t(elem, ord)`;
        await tx`UPDATE evaluations SET total_samples = total_samples + ${count}, updated_at = now() WHERE id = ${id}`;
      }
      return { evaluation_id: id, samples_pushed: count, status: e.status };
    });
  } catch (err) {
    // JSON text PostgreSQL cannot store in jsonb (a \u0000 escape): the client's data, not our fault.
    const code = (err as { code?: string }).code;
    if (code === '22P05' || code === '22P02') throw invalid('samples', `cannot be stored: ${(err as Error).message}`, '(batch)');
    throw err;
  }
}

export async function finalizeEvaluation(sql: Sql, userId: string, id: string, metrics: Record<string, unknown> | null | undefined) {
  return sql.begin(async (tx) => {
    await lockOpen(tx, userId, id);
    const [e] = await tx<EvalRow[]>`
      UPDATE evaluations SET status = ${COMPLETED}, finalized_at = now(), updated_at = now(),
             metrics = CASE WHEN ${metrics ? tx.json(metrics as never) : null}::jsonb IS NULL THEN metrics
                            ELSE COALESCE(metrics, '{}'::jsonb) || ${metrics ? tx.json(metrics as never) : null}::jsonb END
      WHERE id = ${id} RETURNING *`;
    return record(e!);
  });
}

/** One page of samples as stored; the JSON is passed through as text, not re-parsed. */
export async function sampleTexts(sql: Sql, userId: string, id: string, page: number, limit: number) {
  const [e] = await sql<{ total_samples: number }[]>`SELECT e.total_samples FROM evaluations e WHERE e.id = ${id} AND ${visible(sql, userId)}`;
  if (!e) throw notFound('evaluation', id);
  const rows = await sql<{ data: string }[]>`
    SELECT data::text AS data FROM evaluation_samples WHERE evaluation_id = ${id} AND seq >= ${(page - 1) * limit} ORDER BY seq LIMIT ${limit}`;
  return `{"evaluation_id":${JSON.stringify(id)},"samples":[${rows.map((r) => r.data).join(',')}],"total":${e.total_samples},"page":${page},"limit":${limit}}`;
}
