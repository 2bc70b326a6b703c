import { z } from 'zod';
import { idString } from '../http/validate.js';

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
