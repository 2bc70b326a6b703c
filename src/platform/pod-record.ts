import type { Sql, Tx } from '../db/index.js';
import { iso } from '../format.js';
import { usd } from './common.js';
import type { PortMapping } from './providers/provider.js';
import { teamsOf } from '../auth/membership.js';

// A pod as stored and answered: its row, its record (SPEC 4.2) in the create and list
// forms, and the stored JSON (pods.doc) every change rewrites before it commits.

export interface PodRow {
  id: string;
  user_id: string;
  team_id: string | null;
  wallet_id: string;
  name: string;
  provider_id: string;
  provider_ref: string | null;
  offer_id: string;
  node_id: string;
  data_center_id: string;
  country: string;
  cloud_id: string;
  security: string;
  cluster_id: string | null;
  type: string;
  status: string;
  installation_status: string;
  installation_failure: string | null;
  installation_progress: number | null;
  gpu_name: string;
  gpu_count: number;
  socket: string;
  price_hr_units: number;
  stopped_price_hr_units: number | null;
  provisioning_price_hr_units: number;
  environment_type: string;
  custom_template_id: string | null;
  port_mapping: PortMapping[];
  ssh_connection: string | null;
  ip: string | null;
  vcpus: number;
  memory_gb: number;
  disk_gb: number;
  shared_disk_gb: number | null;
  is_spot: boolean | null;
  auto_restart: boolean | null;
  shared_with_team: boolean;
  prepaid_until: Date | null;
  provisioning_minutes: number;
  created_at: Date;
  updated_at: Date;
  active_at: Date | null;
  terminated_at: Date | null;
  attached?: AttachedDisk[];
  total_count?: number;
}

interface AttachedDisk {
  id: string;
  status: string;
  mountPath: string;
  size: number;
  isShared: boolean;
}

/** The ephemeral disk is the instance's own: attached from the start, never detachable. */
const EPHEMERAL_MOUNT = '/ephemeral';
const EPHEMERAL_DEVICE = '/dev/nvme0n1';
/** Persistent disks mount at /data, further ones at /data-2, /data-3 ... */
export const mountPathFor = (position: number) => (position === 0 ? '/data' : `/data-${position + 1}`);

function attachedResources(p: PodRow) {
  const disks = p.attached ?? [];
  return [
    { resourceType: 'DISK', id: 'ephemeral', status: 'ATTACHED', isDetachable: false, mountPath: EPHEMERAL_MOUNT, resourcePath: EPHEMERAL_DEVICE, size: p.disk_gb, isShared: false },
    ...disks.map((d) => ({
      resourceType: 'DISK',
      id: d.id,
      status: d.status,
      isDetachable: true,
      mountPath: d.mountPath,
      resourcePath: d.isShared ? `/mnt/shared/${d.id}` : `/dev/disk/by-id/${d.id}`,
      size: d.size,
      isShared: d.isShared,
    })),
  ];
}

/** Current hourly cost by state: what the meter charges now. */
export function costPerHrUnits(p: Pick<PodRow, 'status' | 'price_hr_units' | 'provisioning_price_hr_units' | 'stopped_price_hr_units'>): number {
  if (p.status === 'PROVISIONING') return p.provisioning_price_hr_units;
  if (p.status === 'STOPPED') return p.stopped_price_hr_units ?? 0;
  if (p.status === 'TERMINATED') return 0;
  return p.price_hr_units;
}

/**
 * The pod record (SPEC 2.1). `form` picks the resources shape: the create
 * response carries numbers under `sharedDisk`, the list schema strings under `shared_disk`.
 */
export function podRecord(p: PodRow, form: 'create' | 'list') {
  const disk = p.disk_gb + (p.attached ?? []).reduce((s, d) => s + d.size, 0);
  const resources =
    form === 'create'
      ? { memory: p.memory_gb, disk, vcpus: p.vcpus, sharedDisk: p.shared_disk_gb }
      : { memory: String(p.memory_gb), disk: String(disk), vcpus: String(p.vcpus), shared_disk: p.shared_disk_gb === null ? null : String(p.shared_disk_gb) };
  return {
    id: p.id,
    userId: p.user_id,
    teamId: p.team_id,
    walletId: p.wallet_id,
    name: p.name,
    providerType: p.provider_id,
    type: p.type,
    status: p.status,
    installationStatus: p.installation_status,
    installationFailure: p.installation_failure,
    installationProgress: p.installation_progress,
    createdAt: iso(p.created_at),
    updatedAt: iso(p.updated_at),
    terminatedAt: iso(p.terminated_at),
    gpuName: p.gpu_name,
    gpuCount: p.gpu_count,
    socket: p.socket,
    priceHr: usd(p.price_hr_units),
    stoppedPriceHr: usd(p.stopped_price_hr_units),
    provisioningPriceHr: usd(p.provisioning_price_hr_units),
    environmentType: p.environment_type,
    customTemplateId: p.custom_template_id,
    clusterId: p.cluster_id,
    primePortMapping: p.port_mapping,
    sshConnection: p.ssh_connection,
    ip: p.ip,
    resources,
    attachedResources: attachedResources(p),
    isSpot: p.is_spot,
    autoRestart: p.auto_restart,
    dataCenterId: p.data_center_id,
    country: p.country,
    cloudId: p.cloud_id,
    security: p.security,
    sharedWithTeam: p.shared_with_team,
    prepaidUntil: iso(p.prepaid_until),
  };
}

/** Pods the caller may read: their own, shared with a team of theirs, or shared with them by id. */
export const podVisible = (sql: Sql | Tx, userId: string) => sql`
  (p.user_id = ${userId}
   OR (p.shared_with_team AND p.team_id IN (${teamsOf(sql, userId)}))
   OR p.id IN (SELECT pod_id FROM pod_shares WHERE user_id = ${userId}))`;

/** Persistent disks of a pod, in attach order; a live pod shows those still attached. */
const attachedJson = (sql: Sql | Tx) => sql`
  COALESCE((SELECT json_agg(json_build_object('id', d.id, 'status', pd.status, 'mountPath', pd.mount_path, 'size', d.size_gb,
                                              'isShared', d.is_multinode) ORDER BY pd.position)
            FROM pod_disks pd JOIN disks d ON d.id = pd.disk_id
            WHERE pd.pod_id = p.id AND pd.detached_at IS NULL), '[]') AS attached`;

/** The stored list-form record of a pod (pods.doc), as the list and get routes send it. */
export const docOf = (p: PodRow): string => JSON.stringify(podRecord(p, 'list'));

/**
 * Rewrites pods.doc from the rows as they are now in this transaction. Every
 * change to a pod or its attachments calls this before it commits.
 */
export async function refreshDocs(tx: Tx, podIds: string[]): Promise<void> {
  if (!podIds.length) return;
  const rows = await tx<PodRow[]>`SELECT p.*, ${attachedJson(tx)} FROM pods p WHERE p.id = ANY(${podIds})`;
  const docs = rows.map((r) => ({ id: r.id, doc: docOf(r) }));
  await tx`UPDATE pods p SET doc = v.doc FROM jsonb_to_recordset(${tx.json(docs as never)}::jsonb) AS v(id text, doc text) WHERE p.id = v.id`;
}
