import type { Sql } from '../db/index.js';
import { notFound } from '../errors.js';
import { platformRoute, type Route } from '../http/router.js';
import { parse } from '../http/validate.js';
import { gpuSummary, listDiskOffers, listGpuOffers, listMultiNodeOffers, type GpuFilters } from './availability.js';
import type { Ctx, Query } from '../http/context.js';
import { whoami } from '../auth/whoami.js';
import { offsetPage, queryInt, queryList, queryStr } from './common.js';
import { diskVisible } from './access.js';
import { createDisk, deleteDisk, getDisk, listDisks, renameDisk } from './disks.js';
import { createEvaluation, finalizeEvaluation, updateEvaluation, getEvaluation, listEvaluations, pushSamples, sampleTexts } from './evaluations.js';
import { cachedRead } from './pod-reads.js';
import { createPod, deletePod, getPod, listPods, podHistory, podStatuses, STATUS_IDS_MAX } from './pods.js';
import { CreateDiskBody, CreateEvaluationBody, CreatePodBody, FinalizeEvaluationBody, UpdateEvaluationBody, GPU_COUNT_MAX, PatchDiskBody, POD_DISKS_MAX, PushSamplesBody } from './protocol.js';
import type { Providers } from './providers/index.js';
import { myTeams, teamMembers } from './teams.js';

// Public platform routes (SPEC 4.1 to 4.4, 4.6): validate, call the logic, answer.

/** SPEC 8: availability pages. */
const PAGE_SIZE_DEFAULT = 100;
const PAGE_SIZE_MAX = 100;
/** A page number past this is past any catalog we hold; the bound keeps OFFSET arithmetic small. */
const PAGE_MAX = 100_000;
/** SPEC 8: pods, teams and members lists default to 100; the spec gives no maximum, 1000 bounds one answer. */
const LIST_LIMIT_DEFAULT = 100;
const LIST_LIMIT_MAX = 1000;
/** SPEC 8: the disks list. */
const DISKS_LIMIT_DEFAULT = 50;
const DISKS_LIMIT_MAX = 200;
/** Evaluation lists and sample pages (the prime-evals client asks for 50 records and 100 samples). */
const EVALS_LIMIT_DEFAULT = 50;
const EVALS_LIMIT_MAX = 200;
const SAMPLES_LIMIT_DEFAULT = 100;
const SAMPLES_LIMIT_MAX = 1000;
/** Region filters: there are a handful of regions; more values than this is not a real query. */
const REGIONS_MAX = 50;

const availabilityPage = (q: Query) => ({
  page: queryInt(q, 'page', 1, 1, PAGE_MAX),
  pageSize: queryInt(q, 'page_size', PAGE_SIZE_DEFAULT, 1, PAGE_SIZE_MAX),
});

export function platformRoutes(sql: Sql, providers: Providers, samplesBodyBytesMax: number): Route[] {
  const r = platformRoute;
  const ok = (body: unknown, status = 200) => ({ status, body });
  /** A body already serialised (by PostgreSQL, on the hot read routes). */
  const raw = (text: string) => ({ raw: text, contentType: 'application/json' });

  /** The filters /gpus and /multi-node share (the CLI sends the same to both). */
  const gpuFilters = async (ctx: Ctx): Promise<GpuFilters> => {
    const q = ctx.query;
    const diskIds = queryList(q, 'disks', POD_DISKS_MAX);
    let diskLocation: GpuFilters['diskLocation'];
    if (diskIds.length) {
      const rows = await sql<{ id: string; provider_id: string; data_center_id: string }[]>`
        SELECT d.id, d.provider_id, d.data_center_id FROM disks d
        WHERE d.id = ANY(${diskIds}) AND d.terminated_at IS NULL AND ${diskVisible(sql, ctx.principal.userId)}`;
      const missing = diskIds.find((id) => !rows.some((d) => d.id === id));
      if (missing) throw notFound('disk', missing);
      const places = new Set(rows.map((d) => `${d.provider_id}\n${d.data_center_id}`));
      // Disks in different places can never attach to one pod: no offer fits.
      diskLocation = places.size === 1 ? { providerId: rows[0]!.provider_id, dataCenterId: rows[0]!.data_center_id, count: rows.length } : null;
    }
    return {
      regions: queryList(q, 'regions', REGIONS_MAX),
      gpuCount: q.get('gpu_count') ? queryInt(q, 'gpu_count', 1, 1, GPU_COUNT_MAX) : undefined,
      gpuType: queryStr(q, 'gpu_type'),
      socket: queryStr(q, 'socket'),
      security: queryStr(q, 'security'),
      dataCenterId: queryStr(q, 'data_center_id'),
      cloudId: queryStr(q, 'cloud_id'),
      diskLocation,
    };
  };

  return [
    // ---- availability ----
    r('GET', '/api/v1/availability/gpus', 'availability:read', async (ctx) => {
      const { page, pageSize } = availabilityPage(ctx.query);
      return ok(await listGpuOffers(sql, await gpuFilters(ctx), page, pageSize));
    }),
    // Prime's CLI asks for both lists on every `availability list` and merges them.
    r('GET', '/api/v1/availability/multi-node', 'availability:read', async (ctx) => {
      const { page, pageSize } = availabilityPage(ctx.query);
      return ok(await listMultiNodeOffers(sql, await gpuFilters(ctx), page, pageSize));
    }),
    r('GET', '/api/v1/availability/gpu-summary', 'availability:read', async () => ok(await gpuSummary(sql))),
    r('GET', '/api/v1/availability/disks', 'availability:read', async (ctx) => {
      const q = ctx.query;
      const { page, pageSize } = availabilityPage(q);
      return ok(
        await listDiskOffers(sql, { regions: queryList(q, 'regions', REGIONS_MAX), dataCenterId: queryStr(q, 'data_center_id'), cloudId: queryStr(q, 'cloud_id') }, page, pageSize),
      );
    }),

    // ---- pods (literal paths before /:podId) ----
    r('POST', '/api/v1/pods', 'instances:write', async (ctx) => ok(await createPod(sql, ctx.principal.userId, parse(CreatePodBody, await ctx.json())))),
    r('GET', '/api/v1/pods', 'instances:read', async (ctx) => {
      const page = offsetPage(ctx.query, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX);
      const userId = ctx.principal.userId;
      return raw(await cachedRead(`list\u0000${userId}\u0000${page.limit}\u0000${page.offset}`, () => listPods(sql, userId, page)));
    }),
    r('GET', '/api/v1/pods/status', 'instances:read', async (ctx) =>
      ok(await podStatuses(sql, ctx.principal.userId, queryList(ctx.query, 'pod_ids', STATUS_IDS_MAX))),
    ),
    r('GET', '/api/v1/pods/history', 'instances:read', async (ctx) =>
      ok(await podHistory(sql, ctx.principal.userId, offsetPage(ctx.query, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX))),
    ),
    r('GET', '/api/v1/pods/:podId', 'instances:read', async (ctx) => raw(await getPod(sql, ctx.principal.userId, ctx.params.podId!))),
    r('DELETE', '/api/v1/pods/:podId', 'instances:write', async (ctx) => ok(await deletePod(sql, providers, ctx.principal.userId, ctx.params.podId!))),

    // ---- disks ----
    r('POST', '/api/v1/disks', 'disks:write', async (ctx) => ok(await createDisk(sql, ctx.principal.userId, parse(CreateDiskBody, await ctx.json())), 201)),
    r('GET', '/api/v1/disks', 'disks:read', async (ctx) => ok(await listDisks(sql, ctx.principal.userId, offsetPage(ctx.query, DISKS_LIMIT_DEFAULT, DISKS_LIMIT_MAX)))),
    r('GET', '/api/v1/disks/:diskId', 'disks:read', async (ctx) => ok(await getDisk(sql, ctx.principal.userId, ctx.params.diskId!))),
    r('PATCH', '/api/v1/disks/:diskId', 'disks:write', async (ctx) => {
      const b = parse(PatchDiskBody, await ctx.json());
      return ok(await renameDisk(sql, ctx.principal.userId, ctx.params.diskId!, b.name));
    }),
    r('DELETE', '/api/v1/disks/:diskId', 'disks:write', async (ctx) => ok(await deleteDisk(sql, providers, ctx.principal.userId, ctx.params.diskId!))),

    // ---- teams ----
    // Any valid key may ask who it belongs to (Prime's `prime whoami` and `prime login`).
    r('GET', '/api/v1/user/whoami', 'authenticated', async (ctx) => ok(await whoami(sql, ctx.principal))),
    r('GET', '/api/v1/user/teams', 'teams:read', async (ctx) => ok(await myTeams(sql, ctx.principal.userId, offsetPage(ctx.query, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX)))),
    r('GET', '/api/v1/teams/:teamId/members', 'teams:read', async (ctx) =>
      ok(await teamMembers(sql, ctx.params.teamId!, ctx.principal.userId, offsetPage(ctx.query, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX))),
    ),

    // ---- evaluation records ----
    r('POST', '/api/v1/evaluations', 'evaluations:write', async (ctx) =>
      ok(await createEvaluation(sql, ctx.principal.userId, parse(CreateEvaluationBody, await ctx.json())), 201),
    ),
    r('GET', '/api/v1/evaluations', 'evaluations:read', async (ctx) => {
      const q = ctx.query;
      const limit = queryInt(q, 'limit', EVALS_LIMIT_DEFAULT, 1, EVALS_LIMIT_MAX);
      // `skip` is the prime-evals client's name; `offset` the rest of this API's.
      const skip = q.has('skip') ? queryInt(q, 'skip', 0, 0, 1_000_000) : queryInt(q, 'offset', 0, 0, 1_000_000);
      return ok(await listEvaluations(sql, ctx.principal.userId, queryStr(q, 'team_id'), skip, limit));
    }),
    r('GET', '/api/v1/evaluations/:evaluationId', 'evaluations:read', async (ctx) => ok(await getEvaluation(sql, ctx.principal.userId, ctx.params.evaluationId!))),
    r('PUT', '/api/v1/evaluations/:evaluationId', 'evaluations:write', async (ctx) =>
      ok(await updateEvaluation(sql, ctx.principal.userId, ctx.params.evaluationId!, parse(UpdateEvaluationBody, await ctx.json()))),
    ),
    r('POST', '/api/v1/evaluations/:evaluationId/finalize', 'evaluations:write', async (ctx) => {
      const b = parse(FinalizeEvaluationBody, await ctx.json());
      return ok(await finalizeEvaluation(sql, ctx.principal.userId, ctx.params.evaluationId!, b?.metrics));
    }),
    r(
      'POST',
      '/api/v1/evaluations/:evaluationId/samples',
      'evaluations:write',
      async (ctx) => {
        const b = parse(PushSamplesBody, await ctx.json());
        const raw = (await ctx.body()).toString('utf8');
        return ok(await pushSamples(sql, ctx.principal.userId, ctx.params.evaluationId!, b.samples.length, raw));
      },
      { bodyBytesMax: samplesBodyBytesMax },
    ),
    r('GET', '/api/v1/evaluations/:evaluationId/samples', 'evaluations:read', async (ctx) => {
      const page = queryInt(ctx.query, 'page', 1, 1, PAGE_MAX);
      const limit = queryInt(ctx.query, 'limit', SAMPLES_LIMIT_DEFAULT, 1, SAMPLES_LIMIT_MAX);
      return raw(await sampleTexts(sql, ctx.principal.userId, ctx.params.evaluationId!, page, limit));
    }),
  ];
}
