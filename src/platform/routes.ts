import type { Sql } from '../db/index.js';
import { notFound } from '../errors.js';
import { platformRoute, routeDoc as doc, type Route } from '../http/router.js';
import { parse } from '../http/validate.js';
import { gpuSummary, listDiskOffers, listGpuOffers, listMultiNodeOffers, type GpuFilters } from './availability.js';
import type { Ctx } from '../http/context.js';
import { whoami } from '../auth/whoami.js';
import { diskVisible } from './access.js';
import { createDisk, deleteDisk, getDisk, listDisks, renameDisk } from './disks.js';
import { createEvaluation, finalizeEvaluation, updateEvaluation, getEvaluation, listEvaluations, pushSamples, sampleTexts } from './evaluations.js';
import { cachedRead } from './pod-reads.js';
import { createPod } from './pod-create.js';
import { deletePod, getPod, listPods, podHistory, podStatuses } from './pods.js';
import {
  CreateDiskBody,
  CreateEvaluationBody,
  CreatePodBody,
  Disk,
  DiskList,
  DiskDeleted,
  DiskRenamed,
  DiskOffersPage,
  DiskOffersQuery,
  DisksQuery,
  Evaluation,
  EvaluationList,
  EvaluationsQuery,
  FinalizeEvaluationBody,
  GpuOffersPage,
  GpuOffersQuery,
  GpuSummary,
  ListQuery,
  PatchDiskBody,
  Pod,
  PodCreated,
  PodDeleted,
  PodHistoryPage,
  PodList,
  PodStatusList,
  PodStatusQuery,
  PushSamplesBody,
  SamplesPage,
  SamplesPushed,
  SamplesQuery,
  MyTeamsPage,
  TeamMembersPage,
  UpdateEvaluationBody,
  Whoami,
} from './protocol.js';
import type { Providers } from './providers/index.js';
import { myTeams, teamMembers } from './teams.js';

// Public platform routes (SPEC 4.1 to 4.4, 4.6): validate, call the logic, answer.

export function platformRoutes(sql: Sql, providers: Providers, samplesBodyBytesMax: number): Route[] {
  const r = platformRoute;
  const ok = (body: unknown, status = 200) => ({ status, body });
  /** A body already serialised (by PostgreSQL, on the hot read routes). */
  const raw = (text: string) => ({ raw: text, contentType: 'application/json' });

  /** The filters /gpus and /multi-node share, with the disks named resolved to where they are. */
  const gpuFilters = async (ctx: Ctx, q: GpuOffersQuery): Promise<GpuFilters> => {
    let diskLocation: GpuFilters['diskLocation'];
    if (q.disks.length) {
      const rows = await sql<{ id: string; provider_id: string; data_center_id: string }[]>`
        SELECT d.id, d.provider_id, d.data_center_id FROM disks d
        WHERE d.id = ANY(${q.disks}) AND d.terminated_at IS NULL AND ${diskVisible(sql, ctx.principal.userId)}`;
      const missing = q.disks.find((id) => !rows.some((d) => d.id === id));
      if (missing) throw notFound('disk', missing);
      const places = new Set(rows.map((d) => `${d.provider_id}\n${d.data_center_id}`));
      // Disks in different places can never attach to one pod: no offer fits.
      diskLocation = places.size === 1 ? { providerId: rows[0]!.provider_id, dataCenterId: rows[0]!.data_center_id, count: rows.length } : null;
    }
    return {
      regions: q.regions,
      gpuCount: q.gpu_count,
      gpuType: q.gpu_type,
      socket: q.socket,
      security: q.security,
      dataCenterId: q.data_center_id,
      cloudId: q.cloud_id,
      diskLocation,
    };
  };

  return [
    // ---- availability ----
    r('GET', '/api/v1/availability/gpus', 'availability:read', doc('availability', 'GPU offers, filtered and paged', { 200: GpuOffersPage }, { query: GpuOffersQuery }), async (ctx) => {
      const q = ctx.queryOf(GpuOffersQuery);
      return ok(await listGpuOffers(sql, await gpuFilters(ctx, q), q.page, q.page_size));
    }),
    // Prime's CLI asks for both lists on every `availability list` and merges them.
    r('GET', '/api/v1/availability/multi-node', 'availability:read', doc('availability', 'Multi-node cluster offers, in the GPU offer shape', { 200: GpuOffersPage }, { query: GpuOffersQuery }), async (ctx) => {
      const q = ctx.queryOf(GpuOffersQuery);
      return ok(await listMultiNodeOffers(sql, await gpuFilters(ctx, q), q.page, q.page_size));
    }),
    r('GET', '/api/v1/availability/gpu-summary', 'availability:read', doc('availability', 'Offer counts and price ranges by GPU type', { 200: GpuSummary }), async () => ok(await gpuSummary(sql))),
    r('GET', '/api/v1/availability/disks', 'availability:read', doc('availability', 'Network disk offers, filtered and paged', { 200: DiskOffersPage }, { query: DiskOffersQuery }), async (ctx) => {
      const q = ctx.queryOf(DiskOffersQuery);
      return ok(await listDiskOffers(sql, { regions: q.regions, dataCenterId: q.data_center_id, cloudId: q.cloud_id }, q.page, q.page_size));
    }),

    // ---- pods (literal paths before /:podId) ----
    r('POST', '/api/v1/pods', 'instances:write', doc('pods', 'Creates a pod on an offer', { 200: PodCreated }, { body: CreatePodBody }), async (ctx) =>
      ok(await createPod(sql, ctx.principal.userId, parse(CreatePodBody, await ctx.json()))),
    ),
    r('GET', '/api/v1/pods', 'instances:read', doc('pods', "The caller's pods (own, team and shared)", { 200: PodList }, { query: ListQuery }), async (ctx) => {
      const page = ctx.queryOf(ListQuery);
      const userId = ctx.principal.userId;
      return raw(await cachedRead(`list\u0000${userId}\u0000${page.limit}\u0000${page.offset}`, () => listPods(sql, userId, page)));
    }),
    r('GET', '/api/v1/pods/status', 'instances:read', doc('pods', 'Status records of the pods named (all live pods when none)', { 200: PodStatusList }, { query: PodStatusQuery }), async (ctx) =>
      ok(await podStatuses(sql, ctx.principal.userId, ctx.queryOf(PodStatusQuery).pod_ids)),
    ),
    r('GET', '/api/v1/pods/history', 'instances:read', doc('pods', "The caller's terminated pods", { 200: PodHistoryPage }, { query: ListQuery }), async (ctx) =>
      ok(await podHistory(sql, ctx.principal.userId, ctx.queryOf(ListQuery))),
    ),
    r('GET', '/api/v1/pods/:podId', 'instances:read', doc('pods', 'One pod', { 200: Pod }), async (ctx) => raw(await getPod(sql, ctx.principal.userId, ctx.params.podId!))),
    r('DELETE', '/api/v1/pods/:podId', 'instances:write', doc('pods', 'Terminates a pod', { 200: PodDeleted }), async (ctx) =>
      ok(await deletePod(sql, providers, ctx.principal.userId, ctx.params.podId!)),
    ),

    // ---- disks ----
    r('POST', '/api/v1/disks', 'disks:write', doc('disks', 'Creates a network disk', { 201: Disk }, { body: CreateDiskBody }), async (ctx) =>
      ok(await createDisk(sql, ctx.principal.userId, parse(CreateDiskBody, await ctx.json())), 201),
    ),
    r('GET', '/api/v1/disks', 'disks:read', doc('disks', "The caller's disks", { 200: DiskList }, { query: DisksQuery }), async (ctx) =>
      ok(await listDisks(sql, ctx.principal.userId, ctx.queryOf(DisksQuery))),
    ),
    r('GET', '/api/v1/disks/:diskId', 'disks:read', doc('disks', 'One disk', { 200: Disk }), async (ctx) => ok(await getDisk(sql, ctx.principal.userId, ctx.params.diskId!))),
    r('PATCH', '/api/v1/disks/:diskId', 'disks:write', doc('disks', 'Renames a disk', { 200: DiskRenamed }, { body: PatchDiskBody }), async (ctx) => {
      const b = parse(PatchDiskBody, await ctx.json());
      return ok(await renameDisk(sql, ctx.principal.userId, ctx.params.diskId!, b.name));
    }),
    r('DELETE', '/api/v1/disks/:diskId', 'disks:write', doc('disks', 'Terminates a disk', { 200: DiskDeleted }), async (ctx) =>
      ok(await deleteDisk(sql, providers, ctx.principal.userId, ctx.params.diskId!)),
    ),

    // ---- teams ----
    // Any valid key may ask who it belongs to (Prime's `prime whoami` and `prime login`).
    r('GET', '/api/v1/user/whoami', 'authenticated', doc('teams', 'The caller: user, key and teams', { 200: Whoami }), async (ctx) => ok(await whoami(sql, ctx.principal))),
    r('GET', '/api/v1/user/teams', 'teams:read', doc('teams', "The caller's teams", { 200: MyTeamsPage }, { query: ListQuery }), async (ctx) =>
      ok(await myTeams(sql, ctx.principal.userId, ctx.queryOf(ListQuery))),
    ),
    r('GET', '/api/v1/teams/:teamId/members', 'teams:read', doc('teams', "A team's members (members only)", { 200: TeamMembersPage }, { query: ListQuery }), async (ctx) =>
      ok(await teamMembers(sql, ctx.params.teamId!, ctx.principal.userId, ctx.queryOf(ListQuery))),
    ),

    // ---- evaluation records ----
    r('POST', '/api/v1/evaluations', 'evaluations:write', doc('evaluation records', 'Creates an evaluation record', { 201: Evaluation }, { body: CreateEvaluationBody }), async (ctx) =>
      ok(await createEvaluation(sql, ctx.principal.userId, parse(CreateEvaluationBody, await ctx.json())), 201),
    ),
    r('GET', '/api/v1/evaluations', 'evaluations:read', doc('evaluation records', "The caller's evaluation records", { 200: EvaluationList }, { query: EvaluationsQuery }), async (ctx) => {
      const q = ctx.queryOf(EvaluationsQuery);
      return ok(await listEvaluations(sql, ctx.principal.userId, q.team_id, q.skip ?? q.offset, q.limit));
    }),
    r('GET', '/api/v1/evaluations/:evaluationId', 'evaluations:read', doc('evaluation records', 'One evaluation record', { 200: Evaluation }), async (ctx) =>
      ok(await getEvaluation(sql, ctx.principal.userId, ctx.params.evaluationId!)),
    ),
    r('PUT', '/api/v1/evaluations/:evaluationId', 'evaluations:write', doc('evaluation records', 'Updates name, metadata or status', { 200: Evaluation }, { body: UpdateEvaluationBody }), async (ctx) =>
      ok(await updateEvaluation(sql, ctx.principal.userId, ctx.params.evaluationId!, parse(UpdateEvaluationBody, await ctx.json()))),
    ),
    r('POST', '/api/v1/evaluations/:evaluationId/finalize', 'evaluations:write', doc('evaluation records', 'Completes a record with its metrics', { 200: Evaluation }, { body: FinalizeEvaluationBody }), async (ctx) => {
      const b = parse(FinalizeEvaluationBody, await ctx.json());
      return ok(await finalizeEvaluation(sql, ctx.principal.userId, ctx.params.evaluationId!, b?.metrics));
    }),
    r(
      'POST',
      '/api/v1/evaluations/:evaluationId/samples',
      'evaluations:write',
      doc('evaluation records', 'Appends samples', { 200: SamplesPushed }, { body: PushSamplesBody }),
      async (ctx) => {
        const b = parse(PushSamplesBody, await ctx.json());
        const raw = (await ctx.body()).toString('utf8');
        return ok(await pushSamples(sql, ctx.principal.userId, ctx.params.evaluationId!, b.samples.length, raw));
      },
      { bodyBytesMax: samplesBodyBytesMax },
    ),
    r('GET', '/api/v1/evaluations/:evaluationId/samples', 'evaluations:read', doc('evaluation records', 'A page of samples', { 200: SamplesPage }, { query: SamplesQuery }), async (ctx) => {
      const q = ctx.queryOf(SamplesQuery);
      return raw(await sampleTexts(sql, ctx.principal.userId, ctx.params.evaluationId!, q.page, q.limit));
    }),
  ];
}
