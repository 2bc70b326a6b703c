import { z } from 'zod';
import { pageQuery, qBool, qInt, qList, qStr } from '../http/query.js';
import { idString } from '../http/validate.js';
import { TEAM_ROLES } from '../auth/protocol.js';

// Request schemas of the platform and admin API (SPEC 4.1 to 4.4, 4.6, 4.7).
// Real clients send explicit nulls and extra keys (DESIGN.md): null means
// absent (`nullish`), unknown keys are dropped (zod's default), except where a
// route says otherwise.

/** Names are free text, but bounded: they end up in lists and logs. */
export const NAME_CHARS_MAX = 255;
/** A pod's persistent disks; the provider's own limit is usually lower and is checked too. */
export const POD_DISKS_MAX = 16;
/** Users a pod can be shared with one by one; beyond this, share with the team. */
export const POD_SHARES_MAX = 100;
/** Largest multi-GPU configuration any cloud sells as one instance. */
export const GPU_COUNT_MAX = 64;
/** SPEC 8: node detach and assignment bulk delete take at most 1000 ids. */
export const INVENTORY_IDS_MAX = 1000;

const id = idString;
const name = z.string().max(NAME_CHARS_MAX, `must be at most ${NAME_CHARS_MAX} characters`);
const count = z.number('must be a number').finite('must be a finite number');

export const CreatePodBody = z.object({
  pod: z.object(
    {
      name: name.nullish(),
      cloudId: id,
      gpuType: id,
      socket: id.nullish(),
      gpuCount: z.number('must be an integer').int('must be an integer').min(1, 'must be at least 1').max(GPU_COUNT_MAX, `must be at most ${GPU_COUNT_MAX}`),
      security: id.nullish(),
      image: id.nullish(),
      customTemplateId: id.nullish(),
      dataCenterId: id.nullish(),
      country: id.nullish(),
      diskSize: count.nullish(),
      vcpus: count.nullish(),
      memory: count.nullish(),
      maxPrice: count.positive('must be greater than 0').nullish(),
      autoRestart: z.boolean('must be a boolean').nullish(),
    },
    'must be an object',
  ),
  provider: z.object({ type: id }, 'must be an object with a type'),
  team: z.object({ teamId: id.nullish() }, 'must be an object').nullish(),
  sharedWithTeam: z.boolean('must be a boolean').nullish(),
  shared_with_team: z.boolean('must be a boolean').nullish(),
  teamMemberIds: z.array(id).max(POD_SHARES_MAX, `must list at most ${POD_SHARES_MAX} users`).nullish(),
  team_member_ids: z.array(id).max(POD_SHARES_MAX, `must list at most ${POD_SHARES_MAX} users`).nullish(),
  disks: z.array(id).max(POD_DISKS_MAX, `must list at most ${POD_DISKS_MAX} disks`).nullish(),
});
export type CreatePodBody = z.infer<typeof CreatePodBody>;

export const CreateDiskBody = z.object({
  disk: z.object(
    {
      size: z.number('must be an integer').int('must be an integer').min(1, 'must be at least 1'),
      name: name.nullish(),
      cloudId: id.nullish(),
      dataCenterId: id.nullish(),
    },
    'must be an object',
  ),
  provider: z.object({ type: id }, 'must be an object with a type'),
  team: z.object({ teamId: id.nullish() }, 'must be an object').nullish(),
});
export type CreateDiskBody = z.infer<typeof CreateDiskBody>;

/** Only the name can change (SPEC 4.3): other keys are refused, not ignored, so a resize attempt is not silently lost. */
export const PatchDiskBody = z.strictObject({ name: name.min(1, 'must not be empty') }, 'only name can be updated');

// Evaluation records (DESIGN.md "Evaluation records"; field names as the prime-evals client sends them).
export const CreateEvaluationBody = z.object({
  name: name.min(1, 'must not be empty'),
  environments: z.array(z.record(z.string(), z.unknown())).max(100, 'must list at most 100 environments').nullish(),
  suite_id: id.nullish(),
  run_id: id.nullish(),
  model_name: name.nullish(),
  dataset: name.nullish(),
  framework: name.nullish(),
  task_type: name.nullish(),
  description: z.string().max(10_000, 'must be at most 10000 characters').nullish(),
  tags: z.array(name).max(100, 'must list at most 100 tags').nullish(),
  metadata: z.record(z.string(), z.unknown()).nullish(),
  metrics: z.record(z.string(), z.unknown()).nullish(),
  team_id: id.nullish(),
  is_public: z.boolean('must be a boolean').nullish(),
});

/**
 * PUT /evaluations/{id}: the fields prime-evals' update_evaluation sends (it drops
 * the ones left None and always sends tags). A field sent replaces the stored one,
 * a field absent is kept; other keys are refused, not ignored.
 */
export const UpdateEvaluationBody = z.strictObject(
  {
    name: name.min(1, 'must not be empty').optional(),
    model_name: name.nullish(),
    dataset: name.nullish(),
    framework: name.nullish(),
    task_type: name.nullish(),
    description: z.string().max(10_000, 'must be at most 10000 characters').nullish(),
    tags: z.array(name).max(100, 'must list at most 100 tags').nullish(),
    metadata: z.record(z.string(), z.unknown()).nullish(),
    metrics: z.record(z.string(), z.unknown()).nullish(),
  },
  'must be an object of name, model_name, dataset, framework, task_type, description, tags, metadata, metrics',
);
export type UpdateEvaluationBody = z.infer<typeof UpdateEvaluationBody>;

export const FinalizeEvaluationBody = z
  .object({ metrics: z.record(z.string(), z.unknown()).nullish() })
  .nullish();

export const PushSamplesBody = z.object({
  samples: z.array(z.record(z.string(), z.unknown(), 'each sample must be a JSON object'), 'must be an array of objects'),
});

// Admin.
export const DetachNodesBody = z.object({
  nodeIds: z.array(id).min(1, 'must list at least one node').max(INVENTORY_IDS_MAX, `must list at most ${INVENTORY_IDS_MAX} nodes`),
});

export const BulkDeleteAssignmentsBody = z.object({
  assignmentIds: z
    .array(id)
    .min(1, 'must list at least one assignment')
    .max(INVENTORY_IDS_MAX, `must list at most ${INVENTORY_IDS_MAX} assignments`),
  expectedStatuses: z.array(id).min(1, 'must list at least one status when sent').max(20, 'must list at most 20 statuses').nullish(),
});

export const ASSIGNMENT_STATUSES = ['PENDING', 'ACTIVE', 'DRAINING', 'ENDED'] as const;
export const PatchAssignmentBody = z.object({ status: z.enum(ASSIGNMENT_STATUSES, `must be one of ${ASSIGNMENT_STATUSES.join(', ')}`) });

// Inventory import (extension): the shape the seed catalog is written in.
const specBody = z.object({
  minCount: count.nullish(),
  maxCount: count.nullish(),
  defaultCount: count.nullish(),
  pricePerUnit: count.min(0, 'must be >= 0').nullish(),
  step: count.positive('must be greater than 0').nullish(),
  defaultIncludedInPrice: z.boolean().nullish(),
  additionalInfo: z.string().max(1000).nullish(),
});
const gb = z.number().int('must be an integer').min(0, 'must be >= 0').max(10_000_000, 'must be at most 10000000');
const positive = z.number().int('must be an integer').min(1, 'must be at least 1');

/** Admin import accepts at most this many rows of one kind per call; larger catalogs go in several calls. */
export const IMPORT_ROWS_MAX = 1000;
const rows = <T extends z.ZodType>(t: T) => z.array(t).max(IMPORT_ROWS_MAX, `must list at most ${IMPORT_ROWS_MAX} rows`).nullish();

export const CatalogBody = z.object({
  providers: rows(z.object({ id, name: name.min(1), driver: id.nullish(), maxDisksPerPod: z.number().int().min(0).max(POD_DISKS_MAX) })),
  dataCenters: rows(z.object({ id, providerId: id, name: name.min(1), region: id, country: id })),
  contracts: rows(z.object({ id, providerId: id, name: name.min(1), status: id.nullish() })),
  nodes: rows(
    z.object({
      id,
      dataCenterId: id,
      contractId: id.nullish(),
      hostname: name.nullish(),
      status: id.nullish(),
      gpuType: id,
      gpuCount: positive.max(1_000_000),
      gpuMemory: gb,
      socket: id,
      interconnect: gb.nullish(),
      interconnectType: id.nullish(),
      vcpus: positive.max(1_000_000),
      memory: positive.max(100_000_000),
      disk: positive.max(100_000_000),
    }),
  ),
  clusters: rows(z.object({ id, name: name.min(1), dataCenterId: id })),
  assignments: rows(z.object({ id, nodeId: id, clusterId: id, status: z.enum(ASSIGNMENT_STATUSES) })),
  gpuOffers: rows(
    z.object({
      id,
      dataCenterId: id,
      cloudId: id,
      gpuType: id,
      gpuCount: positive.max(GPU_COUNT_MAX),
      gpuMemory: gb,
      socket: id,
      security: id,
      disk: specBody,
      vcpu: specBody,
      memory: specBody,
      sharedDisk: specBody.nullish(),
      internetSpeed: count.nullish(),
      interconnect: gb.nullish(),
      interconnectType: id.nullish(),
      provisioningTime: count.min(0).nullish(),
      onDemand: count.min(0, 'must be >= 0'),
      isVariable: z.boolean().nullish(),
      isSpot: z.boolean().nullish(),
      prepaidTime: count.min(0).nullish(),
      images: z.array(id).min(1, 'must list at least one image').max(100),
      active: z.boolean().nullish(),
    }),
  ),
  diskOffers: rows(
    z.object({
      id,
      dataCenterId: id,
      cloudId: id.nullish(),
      spec: specBody,
      security: id,
      isMultinode: z.boolean(),
      capacityGb: gb,
    }),
  ),
});
export type Catalog = z.infer<typeof CatalogBody>;

// ---------------------------------------------------------------- query parameters

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
const EVALS_SKIP_MAX = 1_000_000;
const SAMPLES_LIMIT_DEFAULT = 100;
const SAMPLES_LIMIT_MAX = 1000;
/** Region filters: there are a handful of regions; more values than this is not a real query. */
const REGIONS_MAX = 50;
/** Pods asked for by id in one status call. */
export const STATUS_IDS_MAX = 100;
/** The reason given with a detach is kept in the audit entry; a sentence, not a document. */
const REASON_CHARS_MAX = 1000;

const availabilityPage = { page: qInt(1, 1, PAGE_MAX), page_size: qInt(PAGE_SIZE_DEFAULT, 1, PAGE_SIZE_MAX) };
const place = { regions: qList(REGIONS_MAX), data_center_id: qStr(), cloud_id: qStr() };

/** The filters `/gpus` and `/multi-node` share (Prime's CLI sends the same to both). */
export const GpuOffersQuery = z.object({
  ...availabilityPage,
  ...place,
  gpu_count: qInt(undefined, 1, GPU_COUNT_MAX),
  gpu_type: qStr(),
  socket: qStr(),
  security: qStr(),
  disks: qList(POD_DISKS_MAX).describe('disk ids: only offers where all of them can attach'),
});
export type GpuOffersQuery = z.infer<typeof GpuOffersQuery>;
export const DiskOffersQuery = z.object({ ...availabilityPage, ...place });
export const ListQuery = z.object(pageQuery(LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX));
export const DisksQuery = z.object(pageQuery(DISKS_LIMIT_DEFAULT, DISKS_LIMIT_MAX));
export const PodStatusQuery = z.object({ pod_ids: qList(STATUS_IDS_MAX) });
export const EvaluationsQuery = z.object({
  limit: qInt(EVALS_LIMIT_DEFAULT, 1, EVALS_LIMIT_MAX),
  // `skip` is the prime-evals client's name; `offset` the rest of this API's.
  skip: qInt(undefined, 0, EVALS_SKIP_MAX).describe('the prime-evals client\'s name for offset; wins over it'),
  offset: qInt(0, 0, EVALS_SKIP_MAX),
  team_id: qStr(),
});
export const SamplesQuery = z.object({ page: qInt(1, 1, PAGE_MAX), limit: qInt(SAMPLES_LIMIT_DEFAULT, 1, SAMPLES_LIMIT_MAX) });
export const DetachQuery = z.object({
  dry_run: qBool(),
  dryRun: qBool().describe('alias of dry_run'),
  reason: qStr(REASON_CHARS_MAX).describe('kept in the audit entry'),
});
export const AssignmentsQuery = z.object({ ids: qList(INVENTORY_IDS_MAX), node_id: qStr(), cluster_id: qStr() });
export const AuditQuery = z.object({ operation_id: z.string('is required').min(1, 'is required').max(200, 'must be at most 200 characters') });

// ---------------------------------------------------------------- answers
// Response schemas: /openapi.json is generated from them and the end-to-end suite checks
// every answer against them (CHECK_RESPONSE_SCHEMAS). Comments name where each is built.

// =============================================================== shared pieces

/** platform/pricing.ts ResourceSpec, always every key (normaliseSpec fills null). */
export const ResourceSpec = z.object({
  minCount: z.number().nullable(),
  maxCount: z.number().nullable(),
  defaultCount: z.number().nullable(),
  pricePerUnit: z.number().nullable(),
  step: z.number().nullable(),
  defaultIncludedInPrice: z.boolean().nullable(),
  additionalInfo: z.string().nullable(),
});

/** Generic list envelope keys used by pods/teams lists (offset/limit from offsetPage). */
const pageKeys = {
  total_count: z.number().int(),
  offset: z.number().int(),
  limit: z.number().int(),
};

// =============================================================== availability

/** platform/availability.ts gpuOfferRecord. Shared by /gpus and /multi-node. */
const StockStatus = z.enum(['Low', 'Available']);

export const GpuOffer = z.object({
  cloudId: z.string(), // multi-node: the cluster id
  gpuType: z.string(),
  socket: z.string(),
  provider: z.string(),
  region: z.string(),
  dataCenter: z.string(),
  country: z.string(),
  gpuCount: z.number().int(),
  gpuMemory: z.number().int(),
  disk: ResourceSpec,
  vcpu: ResourceSpec,
  memory: ResourceSpec,
  sharedDisk: ResourceSpec, // EMPTY_SPEC (all null) when the offer has none
  internetSpeed: z.number().nullable(), // double precision
  interconnect: z.number().int().nullable(),
  interconnectType: z.string().nullable(),
  provisioningTime: z.number().nullable(), // double precision (minutes)
  stockStatus: StockStatus, // multi-node: always 'Low' (placements = 1)
  security: z.string(),
  prices: z.object({
    onDemand: z.number(), // usd(on_demand_units); never null (column NOT NULL)
    isVariable: z.boolean(),
    currency: z.literal('USD'),
  }),
  images: z.array(z.string()),
  isSpot: z.boolean(),
  prepaidTime: z.number().nullable(), // double precision (hours)
});

/** GET /availability/gpus and /multi-node: availability.ts listGpuOffers / listMultiNodeOffers. */
export const GpuOffersPage = z.object({
  items: z.array(GpuOffer),
  totalCount: z.number().int(),
});

/** One price cell: availability.ts. USD per hour, null where no offer of that kind. */
export const GpuSummaryCell = z.object({
  onDemand: z.number().nullable(),
  communityPrice: z.number().nullable(),
  spotPrice: z.number().nullable(),
});

/**
 * GET /availability/gpu-summary: availability.ts.
 * `{ [gpuType]: { [String(gpuCount)]: { cheapest: cell, [region]: cell } } }`.
 * Every count map carries `cheapest` plus one key per region (dynamic keys); `{}` when nothing is available.
 */
export const GpuSummary = z.record(z.string(), z.record(z.string(), z.record(z.string(), GpuSummaryCell)));

/** availability.ts diskOfferRecord. */
export const DiskOffer = z.object({
  cloudId: z.string().nullable(),
  provider: z.string(),
  dataCenter: z.string(),
  country: z.string(),
  region: z.string(),
  spec: ResourceSpec,
  stockStatus: StockStatus,
  security: z.string(),
  isMultinode: z.boolean(),
});

/** GET /availability/disks: availability.ts. */
export const DiskOffersPage = z.object({
  items: z.array(DiskOffer),
  totalCount: z.number().int(),
});

// =============================================================== pods

/** platform/providers/provider.ts PortMapping, stored as pods.port_mapping jsonb (default []). */
export const PortMapping = z.object({
  internal: z.string(),
  external: z.string(),
  protocol: z.string(),
  usedBy: z.string().nullable(),
  description: z.string(),
});

/** pod-record.ts attachedResources: the ephemeral disk first, then persistent disks in attach order. */
export const AttachedResource = z.object({
  resourceType: z.literal('DISK'),
  id: z.string(), // 'ephemeral' for the first entry
  status: z.string(), // 'ATTACHED' for ephemeral; pod_disks.status (UNATTACHED/ATTACHED/MOUNTED by comment, not constrained)
  isDetachable: z.boolean(),
  mountPath: z.string(),
  resourcePath: z.string(),
  size: z.number().int(),
  isShared: z.boolean(),
});

/** The keys podRecord (pod-record.ts) emits whatever the form; `resources` differs by form. */
const podRecordKeys = {
  id: z.string(),
  userId: z.string(),
  teamId: z.string().nullable(),
  walletId: z.string(),
  name: z.string(),
  providerType: z.string(),
  type: z.string(), // 'HOSTED' by default, column not constrained
  status: z.string(), // PROVISIONING, ACTIVE, STOPPED, ERROR ... set by providers/reconciler; not a closed set in code
  installationStatus: z.string(),
  installationFailure: z.string().nullable(),
  installationProgress: z.number().int().nullable(),
  createdAt: z.string(),
  updatedAt: z.string(),
  terminatedAt: z.string().nullable(), // always null on list/get (live pods only) and on create
  gpuName: z.string(),
  gpuCount: z.number().int(),
  socket: z.string(),
  priceHr: z.number(),
  stoppedPriceHr: z.number().nullable(),
  provisioningPriceHr: z.number(),
  environmentType: z.string(),
  customTemplateId: z.string().nullable(),
  clusterId: z.string().nullable(),
  primePortMapping: z.array(PortMapping),
  sshConnection: z.string().nullable(),
  ip: z.string().nullable(),
  attachedResources: z.array(AttachedResource),
  isSpot: z.boolean().nullable(),
  autoRestart: z.boolean().nullable(),
  dataCenterId: z.string(),
  country: z.string(),
  cloudId: z.string(),
  security: z.string(),
  sharedWithTeam: z.boolean(),
  prepaidUntil: z.string().nullable(),
};

/**
 * POST /api/v1/pods (status 200, not 201: routes.ts uses ok() default).
 * pod-record.ts podRecord(draft, 'create'): resources are numbers under `sharedDisk`.
 * Its clusterId is the reserved node's cluster (pod-create.ts).
 */
export const PodCreated = z.object({
  ...podRecordKeys,
  resources: z.object({
    memory: z.number().int(),
    disk: z.number().int(), // ephemeral + attached persistent disk sizes
    vcpus: z.number().int(),
    sharedDisk: z.number().int().nullable(), // always null on create (shared_disk_gb: null)
  }),
});

/**
 * The stored list-form pod record (pods.doc, written by pod-record.ts docOf = podRecord(p, 'list')).
 * GET /api/v1/pods/:podId answers this text as stored (routes.ts, pods.ts).
 * Resources are strings under `shared_disk`.
 * pods.doc is a nullable column, but the insert writes it (pod-create.ts) and every change
 * rewrites it (refreshDocs), so a live pod always has one.
 */
export const Pod = z.object({
  ...podRecordKeys,
  resources: z.object({
    memory: z.string(),
    disk: z.string(),
    vcpus: z.string(),
    shared_disk: z.string().nullable(),
  }),
});

/** GET /api/v1/pods: pods.ts, built as text; carries its own status:'success'. */
export const PodList = z.object({
  ...pageKeys,
  data: z.array(Pod),
  status: z.literal('success'),
});

/** GET /api/v1/pods/status: pods.ts. Unknown/foreign ids are left out. */
export const PodStatus = z.object({
  podId: z.string(),
  providerType: z.string(),
  status: z.string(),
  sshConnection: z.string().nullable(),
  costPerHr: z.number(),
  priceHr: z.number(), // same value as costPerHr
  primePortMapping: z.array(PortMapping),
  ip: z.string().nullable(),
  installationFailure: z.string().nullable(),
  installationProgress: z.number().int().nullable(),
});
export const PodStatusList = z.object({ data: z.array(PodStatus) });

/** GET /api/v1/pods/history: pods.ts podHistory (terminated pods). */
export const PodHistoryEntry = z.object({
  id: z.string(),
  name: z.string(),
  providerType: z.string(),
  provisionedBy: z.string(), // users.name of the owner
  type: z.string(),
  createdAt: z.string(),
  terminatedAt: z.string(), // history holds terminated pods only (terminated_at IS NOT NULL)
  gpuName: z.string(),
  gpuCount: z.number().int(),
  socket: z.string(),
  priceHr: z.number(),
  userId: z.string(),
  teamId: z.string().nullable(),
  totalBilledPrice: z.number(), // COALESCE(...,0)::bigint -> never null
});
export const PodHistoryPage = z.object({
  ...pageKeys,
  data: z.array(PodHistoryEntry),
  status: z.literal('success'),
});

/** DELETE /api/v1/pods/:podId: pods.ts. */
export const PodDeleted = z.object({
  id: z.string(),
  status: z.literal('TERMINATED'),
  terminatedAt: z.string(),
});

// =============================================================== disks

/** platform/disks.ts diskRecord: create, list items and get. */
export const Disk = z.object({
  id: z.string(),
  name: z.string(),
  createdAt: z.string(),
  updatedAt: z.string(),
  terminatedAt: z.string().nullable(), // GET /disks/:id includes terminated disks
  status: z.string(), // PROVISIONING / ACTIVE / TERMINATED (+ provider-driven states); column not constrained
  providerType: z.string(),
  size: z.number().int(),
  info: z.object({
    cloudId: z.string().nullable(),
    country: z.string(),
    isMultinode: z.boolean(),
    dataCenterId: z.string(),
  }),
  priceHr: z.number(),
  stoppedPriceHr: z.number(),
  provisioningPriceHr: z.number(),
  userId: z.string(),
  teamId: z.string().nullable(),
  walletId: z.string(),
  pods: z.array(z.string()), // always [] on create (RETURNING * has no usage columns)
  clusters: z.array(z.string()),
});

/** GET /api/v1/disks: disks.ts, both spellings of the total. */
export const DiskList = z.object({
  totalCount: z.number().int(),
  total_count: z.number().int(),
  data: z.array(Disk),
  limit: z.number().int(),
  offset: z.number().int(),
});

/** PATCH /api/v1/disks/:diskId: disks.ts. */
export const DiskRenamed = z.object({ id: z.string(), name: z.string() });

/** DELETE /api/v1/disks/:diskId: disks.ts (no id). */
export const DiskDeleted = z.object({ status: z.literal('TERMINATED') });

// =============================================================== user / teams

/** Scope row per permission area (auth/whoami.ts; areas from auth/principal.ts PERMISSIONS). */
const ScopeRow = z.object({ read: z.boolean(), write: z.boolean() });
export const ScopeTable = z.object({
  instances: ScopeRow,
  availability: ScopeRow,
  disks: ScopeRow,
  teams: ScopeRow,
  billing: ScopeRow,
  evaluations: ScopeRow,
  inference: ScopeRow,
  admin: ScopeRow,
});

/** GET /api/v1/user/whoami: auth/whoami.ts. */
export const Whoami = z.object({
  data: z.object({
    id: z.string(),
    email: z.string(),
    name: z.string(),
    slug: z.null(),
    apiKeyId: z.string(),
    scope: ScopeTable,
  }),
});

/** GET /api/v1/user/teams: platform/teams.ts. */
export const MyTeam = z.object({
  teamId: z.string(),
  name: z.string(),
  slug: z.string(),
  role: z.enum(TEAM_ROLES),
  createdAt: z.string(), // the caller's joined_at, despite the name
});
export const MyTeamsPage = z.object({ ...pageKeys, data: z.array(MyTeam) });

/** GET /api/v1/teams/:teamId/members: platform/teams.ts. */
export const TeamMember = z.object({
  userId: z.string(),
  userName: z.string(),
  userEmail: z.string(),
  role: z.enum(TEAM_ROLES),
  joinedAt: z.string(),
});
export const TeamMembersPage = z.object({ ...pageKeys, data: z.array(TeamMember) });

// =============================================================== evaluations

/** platform/evaluations.ts record(): create, get, list items, PUT and finalize. */
export const Evaluation = z.object({
  evaluation_id: z.string(),
  id: z.string(), // same value as evaluation_id
  name: z.string(),
  status: z.enum(['PENDING', 'COMPLETED']), // only values written (evaluations.ts)
  eval_type: z.enum(['training', 'suite', 'environment']), // evaluations.ts
  user_id: z.string(),
  team_id: z.string().nullable(),
  // Stored as sent (request validated as array of objects, CreateEvaluationBody); null when not sent.
  environments: z.array(z.record(z.string(), z.unknown())).nullable(),
  // ids of environments whose `id` is a string; null exactly when environments is null.
  environment_ids: z.array(z.string()).nullable(),
  suite_id: z.string().nullable(),
  run_id: z.string().nullable(),
  model_name: z.string().nullable(),
  dataset: z.string().nullable(),
  framework: z.string().nullable(),
  task_type: z.string().nullable(),
  description: z.string().nullable(),
  tags: z.array(z.string()),
  metadata: z.record(z.string(), z.unknown()).nullable(),
  metrics: z.record(z.string(), z.unknown()), // `?? {}`: never null
  is_public: z.boolean(),
  total_samples: z.number().int(),
  created_at: z.string(),
  updated_at: z.string(),
  finalized_at: z.string().nullable(),
});

/** GET /api/v1/evaluations: evaluations.ts. `skip` echoes skip (or offset when skip absent). */
export const EvaluationList = z.object({
  evaluations: z.array(Evaluation),
  total: z.number().int(),
  skip: z.number().int(),
  limit: z.number().int(),
});

/** POST /api/v1/evaluations/:id/samples: evaluations.ts; status is always PENDING (lockOpen refuses others with 409). */
export const SamplesPushed = z.object({
  evaluation_id: z.string(),
  samples_pushed: z.number().int(),
  status: z.literal('PENDING'),
});

/**
 * GET /api/v1/evaluations/:id/samples: evaluations.ts, built as text.
 * Samples are passed through from jsonb as pushed (each validated as a JSON object on push).
 * `total` is the record's total_samples, not the page length.
 */
export const SamplesPage = z.object({
  evaluation_id: z.string(),
  samples: z.array(z.record(z.string(), z.unknown())),
  total: z.number().int(),
  page: z.number().int(),
  limit: z.number().int(),
});

/** DELETE /api/admin/disks/:diskId/force: platform/disks.ts. */
export const DiskForceTerminated = z.object({ id: z.string(), status: z.literal('TERMINATED') });

/** GET /api/admin/users/:userId/teams: platform/teams.ts (a bare array inside data). */
export const AdminUserTeam = z.object({
  id: z.string(),
  name: z.string(),
  createdAt: z.string(),
  slug: z.string(),
  email: z.string().nullable(),
  hasBetaAccess: z.boolean(),
});
export const AdminUserTeams = z.array(AdminUserTeam);

/** platform/inventory.ts/31 MutationResult base keys (SPEC 2.8): always all present. */
const mutationKeys = {
  operationId: z.string(),
  message: z.string(),
  targetId: z.string().nullable(),
  targetName: z.string().nullable(),
  created: z.number().int(),
  updated: z.number().int(),
  assigned: z.number().int(), // always 0 today
  detached: z.number().int(),
  retired: z.number().int(), // always 0 today
};
export const MutationResult = z.object(mutationKeys);

/** POST /api/admin/inventory/import: inventory.ts (created/updated counted; targetId/targetName null). */
export const ImportResult = MutationResult;

/**
 * POST .../contracts/:contractId/nodes/detach: inventory.ts (dry run and real).
 * `updated` = assignments ended (or that would end); `detached` = nodes held by the contract.
 */
export const DetachNodesResult = z.object({
  ...mutationKeys,
  targetId: z.string(),
  targetName: z.string(),
  dryRun: z.boolean(),
  notInContract: z.array(z.string()),
});

/** POST /api/admin/inventory/assignments/bulk-delete: inventory.ts. Envelope status 'success' | 'partial'. */
export const BulkDeleteResult = z.object({
  ...mutationKeys,
  deleted: z.number().int(),
  refused: z.array(z.object({ id: z.string(), status: z.string(), reason: z.string() })),
  notFound: z.array(z.string()),
});

/** inventory.ts assignmentRecord. Status set guaranteed by import/PATCH enums and detach ('ENDED'). */
export const Assignment = z.object({
  id: z.string(),
  nodeId: z.string(),
  clusterId: z.string(),
  status: z.enum(ASSIGNMENT_STATUSES),
  createdAt: z.string(),
  updatedAt: z.string(),
  endedAt: z.string().nullable(),
});
/** GET /api/admin/inventory/assignments: inventory.ts (at most 1000, bare array inside data). */
export const AssignmentList = z.array(Assignment);

/**
 * GET /api/admin/inventory/audit: inventory.ts. `detail` is the jsonb written by audit()
 * and depends on `action`: 'import' {counts}, 'contract.nodes.detach' {reason, nodeIds,
 * endedAssignmentIds, notInContract}, 'assignments.bulk_delete' {expectedStatuses, deleted,
 * refused, notFound}; always an object today, so modelled as a free-form record.
 */
export const AuditEntry = z.object({
  id: z.string(),
  operationId: z.string(),
  action: z.string(),
  actorUserId: z.string().nullable(),
  actorKeyId: z.string().nullable(),
  targetId: z.string().nullable(),
  detail: z.record(z.string(), z.unknown()),
  createdAt: z.string(),
});
export const AuditEntryList = z.array(AuditEntry);

