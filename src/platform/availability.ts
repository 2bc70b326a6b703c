import type { Sql } from '../db/index.js';
import { usd } from './common.js';
import { EMPTY_SPEC, normaliseSpec, type ResourceSpec } from './pricing.js';

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
const offerCache = new Map<string, { rows: readonly GpuOfferRow[]; until: number }>();

export function forgetOffers(): void {
  offerCache.clear();
}

/** The offers a create-pod body can mean: one cloudId, in one or several data centers and GPU counts. */
export async function findGpuOffers(sql: Sql, cloudId: string): Promise<readonly GpuOfferRow[]> {
  const hit = offerCache.get(cloudId);
  if (hit && hit.until > Date.now()) return hit.rows;
  const rows = await sql<GpuOfferRow[]>`
    SELECT o.*, dc.region, dc.country, p.max_disks_per_pod, p.driver
    FROM gpu_offers o JOIN data_centers dc ON dc.id = o.data_center_id JOIN providers p ON p.id = o.provider_id
    WHERE o.cloud_id = ${cloudId} AND o.active
    ORDER BY o.id`;
  if (offerCache.size >= OFFER_CACHE_ENTRIES_MAX) offerCache.delete(offerCache.keys().next().value!);
  offerCache.set(cloudId, { rows: [...rows], until: Date.now() + OFFER_CACHE_TTL_MS });
  return rows;
}
