import { ApiError, conflict, invalid } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';
import { openMeter, postTransaction, requireFunded, usdToUnits } from '../money/ledger.js';
import { findGpuOffers, type GpuOfferRow } from './availability.js';
import { usd } from './common.js';
import { diskVisible, holdsDisk, payer } from './access.js';
import { normaliseSpec, podPrice, resolveCount } from './pricing.js';
import type { CreatePodBody } from './protocol.js';
import { membersAmong } from './teams.js';
import { podReads } from './pod-reads.js';
import { reconcileSoon } from './reconciler.js';
import { type PodRow, docOf, mountPathFor, podRecord } from './pod-record.js';

// Pods (SPEC 2.1, 3.2, 4.2): create validates the body against the offer,
// prices it (SPEC 2.11), reserves node capacity and opens billing in one
// transaction; the reconciler then drives the provider. A deleted pod keeps its
// row (terminated_at set): that row is its history record.

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

/** What the body orders of the offer, checked against it and priced (no writes). */
function priceOrder(offer: GpuOfferRow, b: CreatePodBody) {
  const pod = b.pod;
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
  return { image, counts, price, diskIds };
}

/**
 * The pod's row as it will be stored, every column once: the INSERT is made from it.
 * The node and its cluster come from the reservation.
 */
function draftOf(
  o: { id: string; userId: string; teamId: string | null; walletId: string; now: Date; prepaidUntil: Date | null; withTeam: boolean },
  offer: GpuOfferRow,
  b: CreatePodBody,
  { image, counts, price }: ReturnType<typeof priceOrder>,
): PodRow {
  const pod = b.pod;
  return {
    id: o.id,
    user_id: o.userId,
    team_id: o.teamId,
    wallet_id: o.walletId,
    name: pod.name || `pod-${o.id.slice(0, 8)}`,
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
    shared_with_team: o.withTeam,
    prepaid_until: o.prepaidUntil,
    provisioning_minutes: offer.provisioning_minutes ?? 0,
    created_at: o.now,
    updated_at: o.now,
    active_at: null,
    terminated_at: null,
  };
}

export async function createPod(sql: Sql, userId: string, b: CreatePodBody) {
  const pod = b.pod;
  const offer = pickOffer(await findGpuOffers(sql, pod.cloudId), pod);
  const order = priceOrder(offer, b);
  const { counts, price, diskIds } = order;
  const { teamId, walletId } = await payer(sql, userId, b.team?.teamId, 'team.teamId');
  const share = await sharing(sql, b, teamId);

  const id = newId();
  const now = new Date();
  const prepaidHours = offer.prepaid_hours ?? 0;
  const prepaidUntil = prepaidHours > 0 ? new Date(now.getTime() + prepaidHours * 3_600_000) : null;
  const draft = draftOf({ id, userId, teamId, walletId, now, prepaidUntil, withTeam: share.withTeam }, offer, b, order);
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
      rateUnitsPerHr: price.provisioningPriceHrUnits,
      at: prepaidUntil ?? now,
    });
    const insertColumns = { ...draft, attached: undefined, needs_poll: true, next_poll_at: now, max_price_units: pod.maxPrice == null ? null : usdToUnits(pod.maxPrice) };
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
      -- The row is the draft (its columns, once), with the reservation's node and cluster, and the
      -- columns the record does not show: the polling schedule and the price ceiling.
      -- In FROM, so that the record is built once, not once per column as (f()).* would be.
      INSERT INTO pods
      SELECT p.*
      FROM reserved, jsonb_populate_record(NULL::pods, ${tx.json(insertColumns as never)}::jsonb || jsonb_build_object(
             'node_id', reserved.id,
             'cluster_id', reserved.cluster_id,
             'doc', replace(${docOf(draft)}::text, '"clusterId":null', '"clusterId":' || COALESCE(to_json(reserved.cluster_id)::text, 'null')))) AS p
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
  // Committed: this daemon's cached pod lists go now, so the caller reads its write (others on the NOTIFY).
  podReads.changed();
  reconcileSoon(); // provisioning starts now, not at the reconciler's next look
  return podRecord(draft, 'create');
}
