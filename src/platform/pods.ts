import { ApiError, conflict, invalid, notFound } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';
import { log } from '../log.js';
import { closeMeter, openMeter, postTransaction, requireFunded } from '../money/ledger.js';
import { findGpuOffers, type GpuOfferRow } from './availability.js';
import { iso, usd } from './common.js';
import type { Page } from '../http/query.js';
import { diskVisible, holdsDisk, payer } from './access.js';
import { normaliseSpec, podPrice, resolveCount } from './pricing.js';
import { STATUS_IDS_MAX, type CreatePodBody } from './protocol.js';
import type { PortMapping } from './providers/provider.js';
import type { Providers } from './providers/index.js';
import { membersAmong } from './teams.js';

// Pods (SPEC 2.1, 3.2, 4.2): create validates the body against the offer,
// prices it (SPEC 2.11), reserves node capacity and opens billing in one
// transaction; the reconciler then drives the provider. A deleted pod keeps its
// row (terminated_at set): that row is its history record.

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
const mountPathFor = (position: number) => (position === 0 ? '/data' : `/data-${position + 1}`);

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
const podVisible = (sql: Sql | Tx, userId: string) => sql`
  (p.user_id = ${userId}
   OR (p.shared_with_team AND p.team_id IN (SELECT team_id FROM team_members WHERE user_id = ${userId}))
   OR p.id IN (SELECT pod_id FROM pod_shares WHERE user_id = ${userId}))`;

/** Persistent disks of a pod, in attach order; a live pod shows those still attached. */
const attachedJson = (sql: Sql | Tx) => sql`
  COALESCE((SELECT json_agg(json_build_object('id', d.id, 'status', pd.status, 'mountPath', pd.mount_path, 'size', d.size_gb,
                                              'isShared', d.is_multinode) ORDER BY pd.position)
            FROM pod_disks pd JOIN disks d ON d.id = pd.disk_id
            WHERE pd.pod_id = p.id AND pd.detached_at IS NULL), '[]') AS attached`;

/** The stored list-form record of a pod (pods.doc), as the list and get routes send it. */
const docOf = (p: PodRow): string => JSON.stringify(podRecord(p, 'list'));

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

// ---- create ----

interface ValidDisk {
  id: string;
  size: number;
  isShared: boolean;
}

function pickOffer(all: readonly GpuOfferRow[], pod: CreatePodBody['pod']): GpuOfferRow {
  if (!all.length) throw invalid('pod.cloudId', 'matches no offer; copy it from an availability offer', pod.cloudId);
  const offers = pod.dataCenterId ? all.filter((o) => o.data_center_id === pod.dataCenterId) : all;
  if (!offers.length) {
    const dcs = [...new Set(all.map((o) => o.data_center_id))];
    throw invalid('pod.dataCenterId', `must be a data center offering cloudId ${JSON.stringify(pod.cloudId)} (${dcs.join(', ')})`, pod.dataCenterId);
  }
  const sameCount = offers.filter((o) => o.gpu_count === pod.gpuCount);
  if (!sameCount.length) {
    const counts = [...new Set(offers.map((o) => o.gpu_count))].sort((a, b) => a - b);
    throw invalid('pod.gpuCount', `must be one of ${counts.join(', ')} for cloudId ${JSON.stringify(pod.cloudId)}`, pod.gpuCount);
  }
  if (!pod.dataCenterId) {
    // One cloudId can exist in several data centers (SPEC 2.2): the client must say which.
    throw invalid('pod.dataCenterId', `is required: send the offer's dataCenter (${sameCount.map((o) => o.data_center_id).join(', ')})`, null);
  }
  return sameCount[0]!;
}

function checkAgainstOffer(o: GpuOfferRow, b: CreatePodBody): string {
  const pod = b.pod;
  const must = (param: string, expected: string, got: unknown) => {
    throw invalid(param, `must be ${JSON.stringify(expected)} for this offer`, got);
  };
  if (pod.gpuType !== o.gpu_type) must('pod.gpuType', o.gpu_type, pod.gpuType);
  if (pod.socket && pod.socket !== o.socket) must('pod.socket', o.socket, pod.socket);
  if (pod.security && pod.security !== o.security) must('pod.security', o.security, pod.security);
  if (pod.country && pod.country !== o.country) must('pod.country', o.country, pod.country);
  if (b.provider.type !== o.provider_id) must('provider.type', o.provider_id, b.provider.type);
  const image = pod.image ?? o.images[0]!;
  if (!o.images.includes(image)) throw invalid('pod.image', `must be one of the offer's images (${o.images.join(', ')})`, pod.image);
  return image;
}

/** Sharing rules of SPEC 4.2: both need a team; sharedWithTeam wins over teamMemberIds. */
async function sharing(sql: Sql, b: CreatePodBody, teamId: string | null): Promise<{ withTeam: boolean; userIds: string[] }> {
  const withTeam = b.sharedWithTeam ?? b.shared_with_team ?? false;
  const ids = [...new Set(b.teamMemberIds ?? b.team_member_ids ?? [])];
  const idsParam = b.teamMemberIds ? 'teamMemberIds' : 'team_member_ids';
  if (withTeam) {
    if (!teamId) throw invalid('sharedWithTeam', 'requires team.teamId', true);
    return { withTeam: true, userIds: [] };
  }
  if (!ids.length) return { withTeam: false, userIds: [] };
  if (!teamId) throw invalid(idsParam, 'requires team.teamId', ids);
  const members = await membersAmong(sql, teamId, ids);
  const list = b.teamMemberIds ?? b.team_member_ids ?? [];
  list.forEach((u, i) => {
    if (!members.has(u)) throw invalid(`${idsParam}.${i}`, `must be a member of team ${teamId}`, u);
  });
  return { withTeam: false, userIds: ids };
}

/**
 * Locks the requested disks and checks them: visible to the caller, ACTIVE, in
 * the pod's data center, not held by another pod unless multinode. Runs inside
 * the create transaction so a concurrent disk delete or attach cannot slip in.
 */
async function lockDisks(tx: Tx, userId: string, ids: string[], o: GpuOfferRow): Promise<ValidDisk[]> {
  if (!ids.length) return [];
  const rows = await tx<{ id: string; status: string; provider_id: string; data_center_id: string; size_gb: number; is_multinode: boolean; held_by: string | null }[]>`
    SELECT d.id, d.status, d.provider_id, d.data_center_id, d.size_gb, d.is_multinode,
           (SELECT pd.pod_id FROM pod_disks pd WHERE pd.disk_id = d.id AND ${holdsDisk(tx)} LIMIT 1) AS held_by
    FROM disks d WHERE d.id = ANY(${ids}) AND ${diskVisible(tx, userId)}
    ORDER BY d.id FOR UPDATE OF d`;
  const byId = new Map(rows.map((r) => [r.id, r]));
  return ids.map((id, i) => {
    const d = byId.get(id);
    const param = `disks.${i}`;
    if (!d) throw new ApiError('not_found', `${param}: disk ${JSON.stringify(id)} not found`, { param });
    if (d.status !== 'ACTIVE') throw conflict(`${param}: disk ${id} is ${d.status}; only an ACTIVE disk can be attached`, param);
    if (d.provider_id !== o.provider_id || d.data_center_id !== o.data_center_id) {
      throw invalid(param, `must be a disk in ${o.provider_id} ${o.data_center_id} (this disk is in ${d.provider_id} ${d.data_center_id})`, id);
    }
    if (d.held_by && !d.is_multinode) throw conflict(`${param}: disk ${id} is in use by pod ${d.held_by} and is not multinode`, param);
    return { id, size: d.size_gb, isShared: d.is_multinode };
  });
}

export async function createPod(sql: Sql, userId: string, b: CreatePodBody) {
  const pod = b.pod;
  const offer = pickOffer(await findGpuOffers(sql, pod.cloudId), pod);
  const image = checkAgainstOffer(offer, b);
  const specs = { disk: normaliseSpec(offer.disk_spec), vcpu: normaliseSpec(offer.vcpu_spec), memory: normaliseSpec(offer.memory_spec) };
  const counts = {
    disk: resolveCount(specs.disk, pod.diskSize, 'pod.diskSize'),
    vcpus: resolveCount(specs.vcpu, pod.vcpus, 'pod.vcpus'),
    memory: resolveCount(specs.memory, pod.memory, 'pod.memory'),
  };
  const price = podPrice(offer.on_demand_units, specs, counts);
  if (pod.maxPrice !== null && pod.maxPrice !== undefined && usd(price.priceHrUnits)! > pod.maxPrice) {
    throw invalid('pod.maxPrice', `is below the offer's current price of ${usd(price.priceHrUnits)} USD per hour`, pod.maxPrice);
  }
  const diskIds = b.disks ?? [];
  if (new Set(diskIds).size !== diskIds.length) throw invalid('disks', 'must not list a disk twice', diskIds);
  if (diskIds.length > offer.max_disks_per_pod) {
    throw invalid('disks', `must list at most ${offer.max_disks_per_pod} disks for provider ${offer.provider_id}`, diskIds.length);
  }
  const { teamId, walletId } = await payer(sql, userId, b.team?.teamId, 'team.teamId');
  const share = await sharing(sql, b, teamId);

  const id = newId();
  const now = new Date();
  const prepaidHours = offer.prepaid_hours ?? 0;
  const prepaidUntil = prepaidHours > 0 ? new Date(now.getTime() + prepaidHours * 3_600_000) : null;
  // The record as it will be stored; the node and its cluster come from the reservation.
  const draft: PodRow = {
    id,
    user_id: userId,
    team_id: teamId,
    wallet_id: walletId,
    name: pod.name || `pod-${id.slice(0, 8)}`,
    provider_id: offer.provider_id,
    provider_ref: null,
    offer_id: offer.id,
    node_id: '',
    data_center_id: offer.data_center_id,
    country: offer.country,
    cloud_id: offer.cloud_id,
    security: offer.security,
    cluster_id: null,
    type: 'HOSTED',
    status: 'PROVISIONING',
    installation_status: 'PENDING',
    installation_failure: null,
    installation_progress: 0,
    gpu_name: offer.gpu_type,
    gpu_count: offer.gpu_count,
    socket: offer.socket,
    price_hr_units: price.priceHrUnits,
    stopped_price_hr_units: price.stoppedPriceHrUnits,
    provisioning_price_hr_units: price.provisioningPriceHrUnits,
    environment_type: image,
    custom_template_id: pod.customTemplateId ?? null,
    port_mapping: [],
    ssh_connection: null,
    ip: null,
    vcpus: counts.vcpus,
    memory_gb: counts.memory,
    disk_gb: counts.disk,
    shared_disk_gb: null,
    is_spot: offer.is_spot,
    auto_restart: pod.autoRestart ?? null,
    shared_with_team: share.withTeam,
    prepaid_until: prepaidUntil,
    provisioning_minutes: offer.provisioning_minutes ?? 0,
    created_at: now,
    updated_at: now,
    active_at: null,
    terminated_at: null,
  };
  await sql.begin(async (tx) => {
    await requireFunded(tx, walletId, 'a pod');
    const disks = await lockDisks(tx, userId, diskIds, offer);
    draft.attached = disks.map((d, i) => ({ id: d.id, status: 'UNATTACHED', mountPath: mountPathFor(i), size: d.size, isShared: d.isShared }));
    if (prepaidUntil) {
      // Prepaid hours are charged at order (SPEC 2.2 prepaidTime) and the meter starts after them.
      await postTransaction(tx, {
        walletId,
        amount: -Math.round(prepaidHours * price.priceHrUnits),
        type: 'PREPAID_CHARGE',
        description: `${prepaidHours} prepaid hours of pod ${id}`,
        refType: 'pod',
        refId: id,
      });
    }
    await openMeter(tx, {
      walletId,
      resourceType: 'pod',
      resourceId: id,
      state: 'PROVISIONING',
      ratePerHrUsd: usd(price.provisioningPriceHrUnits)!,
      at: prepaidUntil ?? now,
    });
    // Reservation and insert in one statement, last but for attachments before
    // commit: the node row lock is held as briefly as possible. Two orders for
    // the last GPU queue on that lock; the second re-reads the row, finds no
    // room, and inserts nothing. The stored record gets the node's cluster
    // spliced in: JSON.stringify writes exactly `"clusterId":null` for it.
    const [placed] = await tx<{ node_id: string; cluster_id: string | null }[]>`
      WITH pick AS (
        SELECT id FROM nodes
        WHERE data_center_id = ${offer.data_center_id} AND gpu_type = ${offer.gpu_type} AND socket = ${offer.socket}
          AND status = 'ACTIVE' AND contract_id IS NOT NULL
          AND free_gpus >= ${offer.gpu_count} AND free_vcpus >= ${counts.vcpus} AND free_memory_gb >= ${counts.memory} AND free_disk_gb >= ${counts.disk}
        ORDER BY free_gpus, id LIMIT 1 FOR UPDATE
      ), reserved AS (
        UPDATE nodes n SET free_gpus = n.free_gpus - ${offer.gpu_count}, free_vcpus = n.free_vcpus - ${counts.vcpus},
               free_memory_gb = n.free_memory_gb - ${counts.memory}, free_disk_gb = n.free_disk_gb - ${counts.disk}
        FROM pick WHERE n.id = pick.id
        RETURNING n.id, (SELECT a.cluster_id FROM cluster_assignments a WHERE a.node_id = n.id AND a.status = 'ACTIVE' AND a.ended_at IS NULL
                         ORDER BY a.created_at LIMIT 1) AS cluster_id
      )
      INSERT INTO pods (id, user_id, team_id, wallet_id, name, provider_id, offer_id, node_id, data_center_id, country, cloud_id, security,
                        cluster_id, status, installation_status, installation_progress, gpu_name, gpu_count, socket, price_hr_units,
                        stopped_price_hr_units, provisioning_price_hr_units, environment_type, custom_template_id, vcpus, memory_gb, disk_gb,
                        shared_disk_gb, is_spot, auto_restart, shared_with_team, max_price_units, provisioning_minutes, prepaid_until,
                        next_poll_at, created_at, updated_at, doc)
      SELECT ${id}, ${userId}, ${teamId}, ${walletId}, ${draft.name}, ${offer.provider_id}, ${offer.id}, reserved.id,
             ${offer.data_center_id}, ${offer.country}, ${offer.cloud_id}, ${offer.security}, reserved.cluster_id, 'PROVISIONING', 'PENDING', 0,
             ${offer.gpu_type}, ${offer.gpu_count}, ${offer.socket}, ${price.priceHrUnits}, ${price.stoppedPriceHrUnits},
             ${price.provisioningPriceHrUnits}, ${image}, ${draft.custom_template_id}, ${counts.vcpus}, ${counts.memory}, ${counts.disk},
             ${null}, ${offer.is_spot}, ${draft.auto_restart}, ${share.withTeam},
             ${pod.maxPrice == null ? null : Math.round(pod.maxPrice * 10_000)}, ${draft.provisioning_minutes}, ${prepaidUntil},
             ${now}, ${now}, ${now},
             replace(${docOf(draft)}::text, '"clusterId":null', '"clusterId":' || COALESCE(to_json(reserved.cluster_id)::text, 'null'))
      FROM reserved
      RETURNING node_id, cluster_id`;
    if (!placed) {
      throw conflict(
        `no capacity left for ${offer.gpu_count} x ${offer.gpu_type} in ${offer.data_center_id}: another order took it; read availability again`,
        'pod.cloudId',
      );
    }
    draft.node_id = placed.node_id;
    draft.cluster_id = placed.cluster_id;
    if (disks.length) {
      const rows = disks.map((d, i) => ({ pod_id: id, disk_id: d.id, position: i, status: 'UNATTACHED', mount_path: mountPathFor(i) }));
      await tx`INSERT INTO pod_disks ${tx(rows, 'pod_id', 'disk_id', 'position', 'status', 'mount_path')}`;
    }
    if (share.userIds.length) {
      const rows = share.userIds.filter((u) => u !== userId).map((u) => ({ pod_id: id, user_id: u }));
      if (rows.length) await tx`INSERT INTO pod_shares ${tx(rows, 'pod_id', 'user_id')}`;
    }
  });
  return podRecord(draft, 'create');
}

// ---- reads ----

/** One page of the pods the caller may see, newest first, as response text made of the stored records. */
export async function listPods(sql: Sql, userId: string, page: Page): Promise<string> {
  // One scan: the caller's own pods, pods shared with their teams, pods shared with them by id
  // (a bitmap OR over three indexes), counted by a window over the same scan.
  const rows = await sql<{ doc: string; total: number }[]>`
    SELECT p.doc, count(*) OVER ()::int AS total
    FROM pods p
    WHERE p.terminated_at IS NULL
      AND (p.user_id = ${userId}
           OR (p.shared_with_team AND p.team_id = ANY(ARRAY(SELECT team_id FROM team_members WHERE user_id = ${userId})))
           OR p.id = ANY(ARRAY(SELECT pod_id FROM pod_shares WHERE user_id = ${userId})))
    ORDER BY p.created_at DESC, p.id
    LIMIT ${page.limit} OFFSET ${page.offset}`;
  const total = rows[0]?.total ?? (page.offset > 0 ? await countLive(sql, userId) : 0);
  return `{"total_count":${total},"offset":${page.offset},"limit":${page.limit},"data":[${rows.map((r) => r.doc).join(',')}],"status":"success"}`;
}

async function countLive(sql: Sql, userId: string): Promise<number> {
  const [c] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pods p WHERE p.terminated_at IS NULL AND ${podVisible(sql, userId)}`;
  return c!.n;
}

/** A live pod the caller may read, as response text; anything else (unknown, foreign, terminated) is 404. */
export async function getPod(sql: Sql, userId: string, id: string): Promise<string> {
  const [r] = await sql<{ doc: string }[]>`
    SELECT p.doc FROM pods p WHERE p.id = ${id} AND p.terminated_at IS NULL AND ${podVisible(sql, userId)}`;
  if (!r) throw notFound('pod', id);
  return r.doc;
}

/** The pod_ids listed (all live pods of the caller when none, at most STATUS_IDS_MAX); unknown or foreign ids are left out. */
export async function podStatuses(sql: Sql, userId: string, ids: string[]) {
  const rows = await sql<PodRow[]>`
    SELECT p.* FROM pods p
    WHERE p.terminated_at IS NULL AND ${podVisible(sql, userId)} ${ids.length ? sql`AND p.id = ANY(${ids})` : sql``}
    ORDER BY p.created_at DESC, p.id LIMIT ${STATUS_IDS_MAX}`;
  return {
    data: rows.map((p) => ({
      podId: p.id,
      providerType: p.provider_id,
      status: p.status,
      sshConnection: p.ssh_connection,
      costPerHr: usd(costPerHrUnits(p)),
      // Prime's CLI reads the same figure as `priceHr` (prime_cli/api/pods.py PodStatus.cost_per_hr).
      priceHr: usd(costPerHrUnits(p)),
      primePortMapping: p.port_mapping,
      ip: p.ip,
      installationFailure: p.installation_failure,
      installationProgress: p.installation_progress,
    })),
  };
}

export async function podHistory(sql: Sql, userId: string, page: Page) {
  const rows = await sql<(PodRow & { provisioned_by: string; billed_units: number })[]>`
    WITH v AS (
      SELECT id FROM pods WHERE user_id = ${userId} AND terminated_at IS NOT NULL
      UNION
      SELECT p.id FROM team_members m JOIN pods p ON p.team_id = m.team_id AND p.shared_with_team AND p.terminated_at IS NOT NULL
      WHERE m.user_id = ${userId}
      UNION
      SELECT s.pod_id FROM pod_shares s JOIN pods p ON p.id = s.pod_id AND p.terminated_at IS NOT NULL WHERE s.user_id = ${userId}
    )
    SELECT p.*, u.name AS provisioned_by, (SELECT count(*) FROM v)::int AS total_count,
           COALESCE((SELECT -sum(t.amount) FROM wallet_transactions t WHERE t.ref_type = 'pod' AND t.ref_id = p.id
                     AND t.type IN ('POD_CHARGE', 'PREPAID_CHARGE')), 0)::bigint AS billed_units
    FROM pods p JOIN v ON v.id = p.id JOIN users u ON u.id = p.user_id
    ORDER BY p.terminated_at DESC, p.id
    LIMIT ${page.limit} OFFSET ${page.offset}`;
  let total = rows[0]?.total_count;
  if (total === undefined) {
    const [c] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pods p WHERE p.terminated_at IS NOT NULL AND ${podVisible(sql, userId)}`;
    total = c!.n;
  }
  return {
    total_count: total,
    offset: page.offset,
    limit: page.limit,
    data: rows.map((p) => ({
      id: p.id,
      name: p.name,
      providerType: p.provider_id,
      provisionedBy: p.provisioned_by,
      type: p.type,
      createdAt: iso(p.created_at),
      terminatedAt: iso(p.terminated_at),
      gpuName: p.gpu_name,
      gpuCount: p.gpu_count,
      socket: p.socket,
      priceHr: usd(p.price_hr_units),
      userId: p.user_id,
      teamId: p.team_id,
      totalBilledPrice: usd(p.billed_units),
    })),
    status: 'success',
  };
}

// ---- delete ----

/**
 * Ends a pod: capacity back to its node, billing closed at this instant, its
 * disks detached after the provider's detach delay. Only the owner may delete;
 * a pod shared with the caller answers 403, anything else they cannot see 404.
 */
export async function deletePod(sql: Sql, providers: Providers, userId: string, id: string) {
  const provider = await providersFor(sql, providers, id);
  const p = await sql.begin(async (tx) => {
    const [row] = await tx<PodRow[]>`
      SELECT p.* FROM pods p WHERE p.id = ${id} AND p.terminated_at IS NULL AND ${podVisible(tx, userId)} FOR UPDATE OF p`;
    if (!row) throw notFound('pod', id);
    if (row.user_id !== userId) throw new ApiError('forbidden', `pod ${id} is shared with you; only its owner can delete it`, { param: 'pod_id' });
    const now = new Date();
    await tx`
      UPDATE pods SET status = 'TERMINATED', terminated_at = ${now}, updated_at = ${now}, needs_poll = false
      WHERE id = ${id}`;
    await tx`
      UPDATE nodes SET free_gpus = free_gpus + ${row.gpu_count}, free_vcpus = free_vcpus + ${row.vcpus},
             free_memory_gb = free_memory_gb + ${row.memory_gb}, free_disk_gb = free_disk_gb + ${row.disk_gb}
      WHERE id = ${row.node_id}`;
    const detachAt = new Date(now.getTime() + (provider?.detachDelayMs() ?? 0));
    await tx`UPDATE pod_disks SET detached_at = ${detachAt} WHERE pod_id = ${id} AND detached_at IS NULL`;
    await closeMeter(tx, 'pod', id, now);
    return { ...row, terminated_at: now };
  });
  if (p.provider_ref && provider) {
    provider.terminate(p.provider_ref).catch((e) => log.warn({ err: e, podId: id }, 'provider did not confirm pod termination'));
  }
  return { id, status: 'TERMINATED', terminatedAt: iso(p.terminated_at) };
}

async function providersFor(sql: Sql, providers: Providers, podId: string) {
  const [r] = await sql<{ provider_id: string }[]>`SELECT provider_id FROM pods WHERE id = ${podId}`;
  return r ? providers.forProvider(r.provider_id) : undefined;
}
