import type { Sql } from '../db/index.js';
import { usd } from './common.js';
import { EMPTY_SPEC, normaliseSpec, type ResourceSpec } from './pricing.js';
import { TtlCache } from '../cache.js';

// Availability offers (SPEC 4.1), computed from free inventory capacity: an
// offer is listed while some rentable node has room for one pod of it at the
// offer's default size, and its stockStatus follows how many such pods fit.

/** At most this many default-size pods fit: the offer reads `Low` (clients show it as scarce). */
export const LOW_STOCK_PLACEMENTS = 2;
/** A disk pool with less than this share of its capacity free reads `Low`. */
export const LOW_STOCK_DISK_SHARE = 0.1;

export interface GpuOfferRow {
  id: string;
  provider_id: string;
  data_center_id: string;
  region: string;
  country: string;
  cloud_id: string;
  gpu_type: string;
  gpu_count: number;
  gpu_memory_gb: number;
  socket: string;
  security: string;
  disk_spec: ResourceSpec;
  vcpu_spec: ResourceSpec;
  memory_spec: ResourceSpec;
  shared_disk_spec: ResourceSpec | null;
  internet_speed: number | null;
  interconnect_gbps: number | null;
  interconnect_type: string | null;
  provisioning_minutes: number | null;
  on_demand_units: number;
  is_variable: boolean;
  is_spot: boolean;
  prepaid_hours: number | null;
  images: string[];
  max_disks_per_pod: number;
  driver: string;
  placements?: number;
  total_count?: number;
}

export interface GpuFilters {
  regions: string[];
  gpuCount?: number;
  gpuType?: string;
  socket?: string;
  security?: string;
  dataCenterId?: string;
  cloudId?: string;
  /** From the `disks` filter: the one location where all the disks attach (null: none). */
  diskLocation?: { providerId: string; dataCenterId: string; count: number } | null;
}

export function gpuOfferRecord(o: GpuOfferRow) {
  const placements = o.placements ?? 0;
  return {
    cloudId: o.cloud_id,
    gpuType: o.gpu_type,
    socket: o.socket,
    provider: o.provider_id,
    region: o.region,
    dataCenter: o.data_center_id,
    country: o.country,
    gpuCount: o.gpu_count,
    gpuMemory: o.gpu_memory_gb,
    disk: normaliseSpec(o.disk_spec),
    vcpu: normaliseSpec(o.vcpu_spec),
    memory: normaliseSpec(o.memory_spec),
    sharedDisk: o.shared_disk_spec ? normaliseSpec(o.shared_disk_spec) : EMPTY_SPEC,
    internetSpeed: o.internet_speed,
    interconnect: o.interconnect_gbps,
    interconnectType: o.interconnect_type,
    provisioningTime: o.provisioning_minutes,
    stockStatus: placements <= LOW_STOCK_PLACEMENTS ? 'Low' : 'Available',
    security: o.security,
    prices: { onDemand: usd(o.on_demand_units), isVariable: o.is_variable, currency: 'USD' },
    images: o.images,
    isSpot: o.is_spot,
    prepaidTime: o.prepaid_hours,
  };
}

export async function listGpuOffers(sql: Sql, f: GpuFilters, page: number, pageSize: number) {
  if (f.diskLocation === null) return { items: [], totalCount: 0 };
  const rows = await queryGpuOffers(sql, f, pageSize, (page - 1) * pageSize);
  // A page past the end has no row to carry the window count: ask for the first row's.
  const totalCount = rows[0]?.total_count ?? (page > 1 ? ((await queryGpuOffers(sql, f, 1, 0))[0]?.total_count ?? 0) : 0);
  return { items: rows.map(gpuOfferRecord), totalCount };
}

function queryGpuOffers(sql: Sql, f: GpuFilters, limit: number, offset: number) {
  const loc = f.diskLocation;
  return sql<GpuOfferRow[]>`
    SELECT o.*, dc.region, dc.country, p.max_disks_per_pod, p.driver, cap.placements, count(*) OVER ()::int AS total_count
    FROM gpu_offers o
    JOIN data_centers dc ON dc.id = o.data_center_id
    JOIN providers p ON p.id = o.provider_id
    CROSS JOIN LATERAL (
      SELECT COALESCE(sum(LEAST(n.free_gpus / o.gpu_count, n.free_vcpus / GREATEST(o.need_vcpus, 1),
                                n.free_memory_gb / GREATEST(o.need_memory_gb, 1), n.free_disk_gb / GREATEST(o.need_disk_gb, 1))), 0)::int AS placements
      FROM nodes n
      WHERE n.data_center_id = o.data_center_id AND n.gpu_type = o.gpu_type AND n.socket = o.socket
        AND n.status = 'ACTIVE' AND n.contract_id IS NOT NULL AND n.free_gpus >= o.gpu_count
    ) cap
    WHERE o.active AND cap.placements > 0
      ${f.regions.length ? sql`AND dc.region = ANY(${f.regions})` : sql``}
      ${f.gpuCount !== undefined ? sql`AND o.gpu_count = ${f.gpuCount}` : sql``}
      ${f.gpuType ? sql`AND o.gpu_type = ${f.gpuType}` : sql``}
      ${f.socket ? sql`AND o.socket = ${f.socket}` : sql``}
      ${f.security ? sql`AND o.security = ${f.security}` : sql``}
      ${f.dataCenterId ? sql`AND o.data_center_id = ${f.dataCenterId}` : sql``}
      ${f.cloudId ? sql`AND o.cloud_id = ${f.cloudId}` : sql``}
      ${loc ? sql`AND o.provider_id = ${loc.providerId} AND o.data_center_id = ${loc.dataCenterId} AND p.max_disks_per_pod >= ${loc.count}` : sql``}
    ORDER BY o.on_demand_units, o.id
    LIMIT ${limit} OFFSET ${offset}`;
}

interface DiskOfferRow {
  id: string;
  provider_id: string;
  data_center_id: string;
  region: string;
  country: string;
  cloud_id: string | null;
  spec: ResourceSpec;
  security: string;
  is_multinode: boolean;
  capacity_gb: number;
  free_gb: number;
  total_count?: number;
}

export function diskOfferRecord(d: DiskOfferRow) {
  return {
    cloudId: d.cloud_id,
    provider: d.provider_id,
    dataCenter: d.data_center_id,
    country: d.country,
    region: d.region,
    spec: normaliseSpec(d.spec),
    stockStatus: d.free_gb < d.capacity_gb * LOW_STOCK_DISK_SHARE ? 'Low' : 'Available',
    security: d.security,
    isMultinode: d.is_multinode,
  };
}

export interface DiskFilters {
  regions: string[];
  dataCenterId?: string;
  cloudId?: string;
}

export async function listDiskOffers(sql: Sql, f: DiskFilters, page: number, pageSize: number) {
  const where = sql`
    d.active AND d.free_gb >= COALESCE((d.spec->>'minCount')::numeric, 1)
    ${f.regions.length ? sql`AND dc.region = ANY(${f.regions})` : sql``}
    ${f.dataCenterId ? sql`AND d.data_center_id = ${f.dataCenterId}` : sql``}
    ${f.cloudId ? sql`AND d.cloud_id = ${f.cloudId}` : sql``}`;
  const rows = await sql<DiskOfferRow[]>`
    SELECT d.*, dc.region, dc.country, count(*) OVER ()::int AS total_count
    FROM disk_offers d JOIN data_centers dc ON dc.id = d.data_center_id
    WHERE ${where}
    ORDER BY d.id
    LIMIT ${pageSize} OFFSET ${(page - 1) * pageSize}`;
  let totalCount = rows[0]?.total_count;
  if (totalCount === undefined) {
    const [c] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM disk_offers d JOIN data_centers dc ON dc.id = d.data_center_id WHERE ${where}`;
    totalCount = c!.n;
  }
  return { items: rows.map(diskOfferRecord), totalCount };
}

/**
 * Offer definitions (not capacity) change only by import, so pod creation reads
 * them from memory for this long; an import in this process clears them at once,
 * another daemon on the same database sees the change within the TTL.
 */
const OFFER_CACHE_TTL_MS = 5000;
/** Bounds the cache: cloudIds come from request bodies, and most are not real. */
const OFFER_CACHE_ENTRIES_MAX = 10_000;
const offerCache = new TtlCache<readonly GpuOfferRow[]>(OFFER_CACHE_TTL_MS, OFFER_CACHE_ENTRIES_MAX);

export function forgetOffers(): void {
  offerCache.clear();
}

/** The offers a create-pod body can mean: one cloudId, in one or several data centers and GPU counts. */
export async function findGpuOffers(sql: Sql, cloudId: string): Promise<readonly GpuOfferRow[]> {
  return offerCache.get(
    cloudId,
    async () => [
      ...(await sql<GpuOfferRow[]>`
        SELECT o.*, dc.region, dc.country, p.max_disks_per_pod, p.driver
        FROM gpu_offers o JOIN data_centers dc ON dc.id = o.data_center_id JOIN providers p ON p.id = o.provider_id
        WHERE o.cloud_id = ${cloudId} AND o.active
        ORDER BY o.id`),
    ],
  );
}

/**
 * Multi-node offers (GET /availability/multi-node; Prime's CLI merges them into
 * `availability list`). One offer per inventory cluster that can be rented whole
 * now: at least MULTI_NODE_NODES_MIN nodes with an ACTIVE assignment (a PENDING
 * one has not joined the fabric yet), all of one GPU type, socket and GPU count,
 * each node ACTIVE, under contract and with every GPU free. It is priced and
 * specified as the data center's cheapest whole-node offer times the node count
 * (vcpu, memory and disk specs stay per node, as Prime lists them); its cloudId
 * is the cluster id. These offers are listed for discovery: creating a pod takes
 * single-node offers only.
 */
export const MULTI_NODE_NODES_MIN = 2;

export async function listMultiNodeOffers(sql: Sql, f: GpuFilters, page: number, pageSize: number): Promise<{ items: ReturnType<typeof gpuOfferRecord>[]; totalCount: number }> {
  if (f.diskLocation === null) return { items: [], totalCount: 0 };
  const loc = f.diskLocation;
  // The outer select repeats cloud_id, gpu_count and on_demand_units after pr.*:
  // the later (whole-cluster) value is the one a row keeps.
  const rows = await sql<(GpuOfferRow & { node_count: number })[]>`
    WITH live AS (
      SELECT c.id AS cluster_id, c.data_center_id, min(n.gpu_type) AS gpu_type, min(n.socket) AS socket,
             min(n.gpu_count) AS per_node, count(*)::int AS node_count
      FROM clusters c
      JOIN cluster_assignments a ON a.cluster_id = c.id AND a.ended_at IS NULL AND a.status = 'ACTIVE'
      JOIN nodes n ON n.id = a.node_id
      GROUP BY c.id
      HAVING count(*) >= ${MULTI_NODE_NODES_MIN}
         AND bool_and(n.status = 'ACTIVE' AND n.contract_id IS NOT NULL AND n.free_gpus = n.gpu_count)
         AND count(DISTINCT n.gpu_type) = 1 AND count(DISTINCT n.socket) = 1 AND count(DISTINCT n.gpu_count) = 1
    ), priced AS (
      SELECT DISTINCT ON (l.cluster_id) l.cluster_id, l.node_count, o.*
      FROM live l JOIN gpu_offers o
        ON o.data_center_id = l.data_center_id AND o.gpu_type = l.gpu_type AND o.socket = l.socket AND o.gpu_count = l.per_node AND o.active
      ORDER BY l.cluster_id, o.on_demand_units, o.id
    )
    SELECT pr.*, pr.cluster_id AS cloud_id, (pr.gpu_count * pr.node_count)::int AS gpu_count,
           (pr.on_demand_units * pr.node_count)::bigint AS on_demand_units,
           dc.region, dc.country, p.max_disks_per_pod, p.driver, 1 AS placements, count(*) OVER ()::int AS total_count
    FROM priced pr
    JOIN data_centers dc ON dc.id = pr.data_center_id
    JOIN providers p ON p.id = pr.provider_id
    WHERE true
      ${f.regions.length ? sql`AND dc.region = ANY(${f.regions})` : sql``}
      ${f.gpuCount !== undefined ? sql`AND pr.gpu_count * pr.node_count = ${f.gpuCount}` : sql``}
      ${f.gpuType ? sql`AND pr.gpu_type = ${f.gpuType}` : sql``}
      ${f.socket ? sql`AND pr.socket = ${f.socket}` : sql``}
      ${f.security ? sql`AND pr.security = ${f.security}` : sql``}
      ${f.dataCenterId ? sql`AND pr.data_center_id = ${f.dataCenterId}` : sql``}
      ${f.cloudId ? sql`AND pr.cluster_id = ${f.cloudId}` : sql``}
      ${loc ? sql`AND pr.provider_id = ${loc.providerId} AND pr.data_center_id = ${loc.dataCenterId} AND p.max_disks_per_pod >= ${loc.count}` : sql``}
    ORDER BY pr.on_demand_units * pr.node_count, pr.cluster_id
    LIMIT ${pageSize} OFFSET ${(page - 1) * pageSize}`;
  const totalCount: number = rows[0]?.total_count ?? (page > 1 ? (await listMultiNodeOffers(sql, f, 1, 1)).totalCount : 0);
  return { items: rows.map(gpuOfferRecord), totalCount };
}

/** One price cell of the summary: the cheapest offer of each kind, null where there is none. */
interface PriceCell {
  onDemand: number | null;
  communityPrice: number | null;
  spotPrice: number | null;
}

/**
 * GET /availability/gpu-summary, in the shape of Prime's (prime CLI
 * tests/data/availability_summary.json): `{gpuType: {gpuCount: {cheapest: cell,
 * region: cell}}}` over the offers available now. `onDemand` is the cheapest
 * non-spot secure-cloud price, `communityPrice` the cheapest community-cloud one,
 * `spotPrice` the cheapest spot one (USD per hour); the CLI reads only the keys.
 */
export async function gpuSummary(sql: Sql) {
  const rows = await queryGpuOffers(sql, { regions: [] }, 1_000_000, 0);
  const out: Record<string, Record<string, Record<string, PriceCell>>> = {};
  const lower = (a: number | null, b: number | null) => (a === null ? b : b === null ? a : Math.min(a, b));
  for (const o of rows) {
    const byCount = (out[o.gpu_type] ??= {});
    const cells = (byCount[String(o.gpu_count)] ??= {});
    const price = usd(o.on_demand_units);
    for (const k of ['cheapest', o.region]) {
      const c = (cells[k] ??= { onDemand: null, communityPrice: null, spotPrice: null });
      if (o.is_spot) c.spotPrice = lower(c.spotPrice, price);
      else if (o.security === 'community_cloud') c.communityPrice = lower(c.communityPrice, price);
      else c.onDemand = lower(c.onDemand, price);
    }
  }
  return out;
}
