import { ApiError, notFound } from '../errors.js';
import type { Sql } from '../db/index.js';
import { log } from '../log.js';
import { closeMeter } from '../money/ledger.js';
import { iso } from '../format.js';
import { usd } from './common.js';
import type { Page } from '../http/query.js';
import { STATUS_IDS_MAX } from './protocol.js';
import type { Providers } from './providers/index.js';
import { teamsOf } from '../auth/membership.js';
import { podReads } from './pod-reads.js';
import { type PodRow, costPerHrUnits, podVisible } from './pod-record.js';

// Pod reads (list, one, statuses, history) and deletion; creation is pod-create.ts,
// the record and its stored form pod-record.ts.

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
           OR (p.shared_with_team AND p.team_id = ANY(ARRAY(${teamsOf(sql, userId)})))
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
  podReads.changed();
  if (p.provider_ref && provider) {
    provider.terminate(p.provider_ref).catch((e) => log.warn({ err: e, podId: id }, 'provider did not confirm pod termination'));
  }
  return { id, status: 'TERMINATED', terminatedAt: iso(p.terminated_at) };
}

async function providersFor(sql: Sql, providers: Providers, podId: string) {
  const [r] = await sql<{ provider_id: string }[]>`SELECT provider_id FROM pods WHERE id = ${podId}`;
  return r ? providers.forProvider(r.provider_id) : undefined;
}
