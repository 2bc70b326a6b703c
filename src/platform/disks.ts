import { conflict, invalid, notFound } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';
import { closeMeter, openMeter, requireFunded } from '../money/ledger.js';
import { iso } from '../format.js';
import { usd } from './common.js';
import type { Page } from '../http/query.js';
import { diskPriceUnits, normaliseSpec, resolveCount, type ResourceSpec } from './pricing.js';
import type { CreateDiskBody } from './protocol.js';
import { diskVisible, holdsDisk, payer } from './access.js';
import { log } from '../log.js';
import type { Providers } from './providers/index.js';
import { refreshDocs } from './pod-record.js';
import { podReads } from './pod-reads.js';
import { reconcileSoon } from './reconciler.js';

// Network disks (SPEC 2.4, 3.1, 4.3): created from a disk offer's storage pool,
// billed from creation to termination, attachable to pods in their data center.
// A deleted disk keeps its row (TERMINATED).

export interface DiskRow {
  id: string;
  user_id: string;
  team_id: string | null;
  wallet_id: string;
  name: string;
  offer_id: string;
  provider_id: string;
  provider_ref: string | null;
  data_center_id: string;
  country: string;
  cloud_id: string | null;
  is_multinode: boolean;
  size_gb: number;
  price_hr_units: number;
  status: string;
  created_at: Date;
  updated_at: Date;
  terminated_at: Date | null;
  pods?: string[];
  clusters?: string[];
  total_count?: number;
}

export function diskRecord(d: DiskRow) {
  const price = usd(d.price_hr_units);
  return {
    id: d.id,
    name: d.name,
    createdAt: iso(d.created_at),
    updatedAt: iso(d.updated_at),
    terminatedAt: iso(d.terminated_at),
    status: d.status,
    providerType: d.provider_id,
    size: d.size_gb,
    info: { cloudId: d.cloud_id, country: d.country, isMultinode: d.is_multinode, dataCenterId: d.data_center_id },
    // Disks are billed the same whatever their state (SPEC 2.11 rule 5).
    priceHr: price,
    stoppedPriceHr: price,
    provisioningPriceHr: price,
    userId: d.user_id,
    teamId: d.team_id,
    walletId: d.wallet_id,
    pods: d.pods ?? [],
    clusters: d.clusters ?? [],
  };
}

const withUsage = (sql: Sql | Tx) => sql`
  COALESCE((SELECT array_agg(pd.pod_id ORDER BY pd.pod_id) FROM pod_disks pd WHERE pd.disk_id = d.id AND ${holdsDisk(sql)}), '{}') AS pods,
  COALESCE((SELECT array_agg(DISTINCT p.cluster_id) FROM pod_disks pd JOIN pods p ON p.id = pd.pod_id
            WHERE pd.disk_id = d.id AND ${holdsDisk(sql)} AND p.cluster_id IS NOT NULL), '{}') AS clusters`;

interface DiskOfferRow {
  id: string;
  provider_id: string;
  data_center_id: string;
  country: string;
  cloud_id: string | null;
  spec: ResourceSpec;
  is_multinode: boolean;
}

async function resolveDiskOffer(sql: Sql, b: CreateDiskBody): Promise<DiskOfferRow> {
  const all = await sql<DiskOfferRow[]>`
    SELECT d.id, d.provider_id, d.data_center_id, dc.country, d.cloud_id, d.spec, d.is_multinode
    FROM disk_offers d JOIN data_centers dc ON dc.id = d.data_center_id
    WHERE d.provider_id = ${b.provider.type} AND d.active ORDER BY d.id`;
  if (!all.length) throw invalid('provider.type', 'no disk offer from this provider', b.provider.type);
  let offers: DiskOfferRow[] = [...all];
  if (b.disk.dataCenterId) {
    offers = offers.filter((o) => o.data_center_id === b.disk.dataCenterId);
    if (!offers.length) {
      throw invalid('disk.dataCenterId', `must be a data center where ${b.provider.type} offers disks (${[...new Set(all.map((o) => o.data_center_id))].join(', ')})`, b.disk.dataCenterId);
    }
  }
  if (b.disk.cloudId) {
    const byCloud = offers.filter((o) => o.cloud_id === b.disk.cloudId);
    if (!byCloud.length) throw invalid('disk.cloudId', 'no disk offer with this cloudId here', b.disk.cloudId);
    offers = byCloud;
  }
  if (offers.length > 1) {
    throw invalid('disk.dataCenterId', `is required: ${b.provider.type} offers disks in ${offers.map((o) => o.data_center_id).join(', ')}`, b.disk.dataCenterId ?? null);
  }
  const o = offers[0]!;
  if (o.cloud_id && !b.disk.cloudId) throw invalid('disk.cloudId', `is required for this offer (${o.cloud_id})`, null);
  if (!b.disk.dataCenterId) throw invalid('disk.dataCenterId', `is required for this offer (${o.data_center_id})`, null);
  return o;
}

export async function createDisk(sql: Sql, userId: string, b: CreateDiskBody) {
  const offer = await resolveDiskOffer(sql, b);
  const spec = normaliseSpec(offer.spec);
  const size = resolveCount(spec, b.disk.size, 'disk.size');
  const { teamId, walletId } = await payer(sql, userId, b.team?.teamId, 'team.teamId');
  const id = newId();
  const name = b.disk.name || `disk-${id.slice(0, 8)}`;
  const priceUnits = diskPriceUnits(spec, size);
  const now = new Date();
  const row = await sql.begin(async (tx) => {
    await requireFunded(tx, walletId, 'a disk');
    const [pool] = await tx`UPDATE disk_offers SET free_gb = free_gb - ${size} WHERE id = ${offer.id} AND free_gb >= ${size} RETURNING free_gb`;
    if (!pool) throw conflict(`not enough free storage in ${offer.data_center_id} for a ${size} GB disk`, 'disk.size');
    await openMeter(tx, { walletId, resourceType: 'disk', resourceId: id, state: 'PROVISIONING', rateUnitsPerHr: priceUnits, at: now });
    const [d] = await tx<DiskRow[]>`
      INSERT INTO disks (id, user_id, team_id, wallet_id, name, offer_id, provider_id, data_center_id, country, cloud_id, is_multinode,
                         size_gb, price_hr_units, status, ready_at, created_at, updated_at)
      VALUES (${id}, ${userId}, ${teamId}, ${walletId}, ${name}, ${offer.id}, ${offer.provider_id}, ${offer.data_center_id}, ${offer.country},
              ${offer.cloud_id}, ${offer.is_multinode}, ${size}, ${priceUnits}, 'PROVISIONING', ${now}, ${now}, ${now})
      RETURNING *`;
    return d!;
  });
  reconcileSoon(); // provisioning starts now, not at the reconciler's next look
  return diskRecord(row);
}

export async function listDisks(sql: Sql, userId: string, page: Page) {
  const rows = await sql<DiskRow[]>`
    SELECT d.*, ${withUsage(sql)}, count(*) OVER ()::int AS total_count
    FROM disks d WHERE d.terminated_at IS NULL AND ${diskVisible(sql, userId)}
    ORDER BY d.created_at DESC, d.id
    LIMIT ${page.limit} OFFSET ${page.offset}`;
  let total = rows[0]?.total_count;
  if (total === undefined) {
    const [c] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM disks d WHERE d.terminated_at IS NULL AND ${diskVisible(sql, userId)}`;
    total = c!.n;
  }
  // Both spellings: the spec's totalCount and the total_count real clients read (DESIGN.md).
  return { totalCount: total, total_count: total, data: rows.map(diskRecord), limit: page.limit, offset: page.offset };
}

/** One disk, terminated ones included (the row is kept). Another owner's disk is 404. */
export async function getDisk(sql: Sql, userId: string, id: string) {
  const [d] = await sql<DiskRow[]>`SELECT d.*, ${withUsage(sql)} FROM disks d WHERE d.id = ${id} AND ${diskVisible(sql, userId)}`;
  if (!d) throw notFound('disk', id);
  return diskRecord(d);
}

export async function renameDisk(sql: Sql, userId: string, id: string, name: string) {
  const [d] = await sql<{ id: string; name: string }[]>`
    UPDATE disks d SET name = ${name}, updated_at = now() WHERE d.id = ${id} AND ${diskVisible(sql, userId)} RETURNING d.id, d.name`;
  if (!d) throw notFound('disk', id);
  return { id: d.id, name: d.name };
}

/** Ends a disk inside a transaction: state, pool capacity and billing together. */
async function terminate(tx: Tx, d: DiskRow, now: Date): Promise<void> {
  await tx`UPDATE disks SET status = 'TERMINATED', terminated_at = ${now}, updated_at = ${now} WHERE id = ${d.id}`;
  await tx`UPDATE disk_offers SET free_gb = free_gb + ${d.size_gb} WHERE id = ${d.offer_id}`;
  await closeMeter(tx, 'disk', d.id, now);
}

export async function deleteDisk(sql: Sql, providers: Providers, userId: string, id: string) {
  const d = await sql.begin(async (tx) => {
    const [row] = await tx<DiskRow[]>`SELECT d.* FROM disks d WHERE d.id = ${id} AND ${diskVisible(tx, userId)} FOR UPDATE`;
    if (!row) throw notFound('disk', id);
    if (row.status !== 'ACTIVE') throw conflict(`disk ${id} is ${row.status}; only an ACTIVE disk can be deleted`, 'status');
    const users = await tx<{ pod_id: string; detached_at: Date | null }[]>`
      SELECT pd.pod_id, pd.detached_at FROM pod_disks pd WHERE pd.disk_id = ${id} AND ${holdsDisk(tx)}`;
    if (users.length) {
      const detaching = users.every((u) => u.detached_at);
      throw conflict(
        detaching
          ? `disk ${id} is still being detached from terminated pod ${users.map((u) => u.pod_id).join(', ')}; detachment takes a few moments, try again shortly`
          : `disk ${id} is in use by pod ${users.map((u) => u.pod_id).join(', ')}; delete the pod first`,
        'id',
      );
    }
    await terminate(tx, row, new Date());
    return row;
  });
  void terminateAtProvider(providers, d);
  return { status: 'TERMINATED' };
}

/** Admin force terminate (SPEC 4.7): any non-terminated disk, attachments ended at once. */
export async function forceTerminateDisk(sql: Sql, providers: Providers, id: string) {
  const d = await sql.begin(async (tx) => {
    const [row] = await tx<DiskRow[]>`SELECT * FROM disks WHERE id = ${id} FOR UPDATE`;
    if (!row) throw notFound('disk', id);
    if (row.status === 'TERMINATED') throw conflict(`disk ${id} is already TERMINATED`, 'status');
    const now = new Date();
    // Pods before their attachment rows, in id order: the order the reconciler
    // and pod deletion take, so this cannot deadlock with a pod being polled.
    // Holding the disk row keeps new attachments out meanwhile.
    await tx`
      SELECT p.id FROM pods p WHERE p.id IN (SELECT pod_id FROM pod_disks WHERE disk_id = ${id}) ORDER BY p.id FOR UPDATE OF p`;
    const held = await tx<{ pod_id: string }[]>`
      UPDATE pod_disks SET detached_at = ${now} WHERE disk_id = ${id} AND (detached_at IS NULL OR detached_at > ${now}) RETURNING pod_id`;
    await terminate(tx, row, now);
    // Live pods that held it no longer list it.
    await refreshDocs(tx, held.map((h) => h.pod_id));
    return row;
  });
  podReads.changed();
  void terminateAtProvider(providers, d);
  return { id, status: 'TERMINATED' };
}

async function terminateAtProvider(providers: Providers, d: DiskRow): Promise<void> {
  if (!d.provider_ref) return;
  try {
    await (await providers.forProvider(d.provider_id)).terminateDisk(d.provider_ref);
  } catch (e) {
    log.warn({ err: e, diskId: d.id }, 'provider did not confirm disk termination');
  }
}
