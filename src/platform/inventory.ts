import { ApiError, conflict, invalid, notFound } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';
import { iso } from '../format.js';
import { normaliseSpec } from './pricing.js';
import type { Catalog } from './protocol.js';
import { forgetOffers } from './availability.js';

// Inventory rows: import (the seed and the admin import), contract node detach,
// assignment bulk delete and status changes, and the audit trail they leave.

export interface Actor {
  userId: string | null;
  keyId: string | null;
}

/** SPEC 2.8. Counts are integers, 0 when the operation does not do that kind of change. */
export interface MutationResult {
  operationId: string;
  message: string;
  targetId: string | null;
  targetName: string | null;
  created: number;
  updated: number;
  assigned: number;
  detached: number;
  retired: number;
  [extra: string]: unknown;
}

function mutation(operationId: string, message: string, extra: Partial<MutationResult> = {}): MutationResult {
  return { operationId, message, targetId: null, targetName: null, created: 0, updated: 0, assigned: 0, detached: 0, retired: 0, ...extra };
}

async function audit(tx: Tx, operationId: string, action: string, actor: Actor, targetId: string | null, detail: unknown): Promise<void> {
  await tx`
    INSERT INTO inventory_audit (id, operation_id, action, actor_user_id, actor_key_id, target_id, detail)
    VALUES (${newId()}, ${operationId}, ${action}, ${actor.userId}, ${actor.keyId}, ${targetId}, ${tx.json(detail as never)})`;
}

const pgCode = (e: unknown) => (e as { code?: string }).code;

/**
 * Inserts catalog rows. `keep` leaves existing rows alone (the seed, run at every
 * start); `update` overwrites them (admin import), shifting free capacity by the
 * change in totals and refusing to shrink a node below what pods hold.
 */
export async function importCatalog(tx: Tx, c: Catalog, mode: 'keep' | 'update'): Promise<{ created: number; updated: number }> {
  let created = 0;
  let updated = 0;
  const tally = (rows: { inserted: boolean }[]) => {
    for (const r of rows) r.inserted ? created++ : updated++;
  };
  const upd = mode === 'update';
  try {
    for (const p of c.providers ?? []) {
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO providers (id, name, driver, max_disks_per_pod) VALUES (${p.id}, ${p.name}, ${p.driver ?? 'simulated'}, ${p.maxDisksPerPod})
        ON CONFLICT (id) DO ${upd ? tx`UPDATE SET name = EXCLUDED.name, driver = EXCLUDED.driver, max_disks_per_pod = EXCLUDED.max_disks_per_pod` : tx`NOTHING`}
        RETURNING (xmax = 0) AS inserted`);
    }
    for (const d of c.dataCenters ?? []) {
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO data_centers (id, provider_id, name, region, country) VALUES (${d.id}, ${d.providerId}, ${d.name}, ${d.region}, ${d.country})
        ON CONFLICT (id) DO ${upd ? tx`UPDATE SET name = EXCLUDED.name, region = EXCLUDED.region, country = EXCLUDED.country` : tx`NOTHING`}
        RETURNING (xmax = 0) AS inserted`);
    }
    for (const k of c.contracts ?? []) {
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO contracts (id, provider_id, name, status) VALUES (${k.id}, ${k.providerId}, ${k.name}, ${k.status ?? 'ACTIVE'})
        ON CONFLICT (id) DO ${upd ? tx`UPDATE SET name = EXCLUDED.name, status = EXCLUDED.status` : tx`NOTHING`}
        RETURNING (xmax = 0) AS inserted`);
    }
    if (c.nodes?.length) {
      const rows = c.nodes.map((n) => ({
        id: n.id,
        data_center_id: n.dataCenterId,
        contract_id: n.contractId ?? null,
        hostname: n.hostname ?? null,
        status: n.status ?? 'ACTIVE',
        gpu_type: n.gpuType,
        gpu_count: n.gpuCount,
        gpu_memory_gb: n.gpuMemory,
        socket: n.socket,
        interconnect_gbps: n.interconnect ?? null,
        interconnect_type: n.interconnectType ?? null,
        vcpus: n.vcpus,
        memory_gb: n.memory,
        disk_gb: n.disk,
      }));
      // provider_id follows the data center; free_* start at the totals.
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO nodes (id, provider_id, data_center_id, contract_id, hostname, status, gpu_type, gpu_count, gpu_memory_gb, socket,
                           interconnect_gbps, interconnect_type, vcpus, memory_gb, disk_gb, free_gpus, free_vcpus, free_memory_gb, free_disk_gb)
        SELECT r.id, dc.provider_id, r.data_center_id, r.contract_id, r.hostname, r.status, r.gpu_type, r.gpu_count, r.gpu_memory_gb, r.socket,
               r.interconnect_gbps, r.interconnect_type, r.vcpus, r.memory_gb, r.disk_gb, r.gpu_count, r.vcpus, r.memory_gb, r.disk_gb
        FROM jsonb_to_recordset(${tx.json(rows as never)}::jsonb) AS r(id text, data_center_id text, contract_id text, hostname text, status text,
             gpu_type text, gpu_count int, gpu_memory_gb int, socket text, interconnect_gbps int, interconnect_type text,
             vcpus int, memory_gb int, disk_gb int)
        LEFT JOIN data_centers dc ON dc.id = r.data_center_id
        ON CONFLICT (id) DO ${
          upd
            ? tx`UPDATE SET contract_id = EXCLUDED.contract_id, hostname = EXCLUDED.hostname, status = EXCLUDED.status,
                 gpu_type = EXCLUDED.gpu_type, gpu_memory_gb = EXCLUDED.gpu_memory_gb, socket = EXCLUDED.socket,
                 interconnect_gbps = EXCLUDED.interconnect_gbps, interconnect_type = EXCLUDED.interconnect_type,
                 free_gpus = nodes.free_gpus + EXCLUDED.gpu_count - nodes.gpu_count, gpu_count = EXCLUDED.gpu_count,
                 free_vcpus = nodes.free_vcpus + EXCLUDED.vcpus - nodes.vcpus, vcpus = EXCLUDED.vcpus,
                 free_memory_gb = nodes.free_memory_gb + EXCLUDED.memory_gb - nodes.memory_gb, memory_gb = EXCLUDED.memory_gb,
                 free_disk_gb = nodes.free_disk_gb + EXCLUDED.disk_gb - nodes.disk_gb, disk_gb = EXCLUDED.disk_gb,
                 updated_at = now()`
            : tx`NOTHING`
        }
        RETURNING (xmax = 0) AS inserted`);
      const ids = c.nodes.map((n) => n.id);
      // Contract history: a node whose contract changed ends its old row and opens a new one.
      await tx`
        UPDATE contract_nodes cn SET detached_at = now() FROM nodes n
        WHERE cn.node_id = n.id AND n.id = ANY(${ids}) AND cn.detached_at IS NULL AND cn.contract_id IS DISTINCT FROM n.contract_id`;
      await tx`
        INSERT INTO contract_nodes (id, contract_id, node_id)
        SELECT gen_random_uuid()::text, n.contract_id, n.id FROM nodes n
        WHERE n.id = ANY(${ids}) AND n.contract_id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM contract_nodes cn WHERE cn.node_id = n.id AND cn.detached_at IS NULL)`;
    }
    for (const k of c.clusters ?? []) {
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO clusters (id, name, data_center_id) VALUES (${k.id}, ${k.name}, ${k.dataCenterId})
        ON CONFLICT (id) DO ${upd ? tx`UPDATE SET name = EXCLUDED.name` : tx`NOTHING`}
        RETURNING (xmax = 0) AS inserted`);
    }
    for (const a of c.assignments ?? []) {
      const ended = a.status === 'ENDED';
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO cluster_assignments (id, node_id, cluster_id, status, ended_at)
        VALUES (${a.id}, ${a.nodeId}, ${a.clusterId}, ${a.status}, ${ended ? new Date() : null})
        ON CONFLICT (id) DO ${
          upd
            ? tx`UPDATE SET status = EXCLUDED.status, updated_at = now(),
                 ended_at = CASE WHEN EXCLUDED.status = 'ENDED' THEN COALESCE(cluster_assignments.ended_at, now()) ELSE NULL END`
            : tx`NOTHING`
        }
        RETURNING (xmax = 0) AS inserted`);
    }
    for (const o of c.gpuOffers ?? []) {
      const disk = normaliseSpec(o.disk);
      const vcpu = normaliseSpec(o.vcpu);
      const memory = normaliseSpec(o.memory);
      const need = (s: typeof disk) => Math.max(0, Math.ceil(s.defaultCount ?? s.minCount ?? 0));
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO gpu_offers (id, provider_id, data_center_id, cloud_id, gpu_type, gpu_count, gpu_memory_gb, socket, security,
                                disk_spec, vcpu_spec, memory_spec, shared_disk_spec, need_vcpus, need_memory_gb, need_disk_gb,
                                internet_speed, interconnect_gbps, interconnect_type, provisioning_minutes, on_demand_units,
                                is_variable, is_spot, prepaid_hours, images, active)
        SELECT ${o.id}, dc.provider_id, ${o.dataCenterId}, ${o.cloudId}, ${o.gpuType}, ${o.gpuCount}, ${o.gpuMemory}, ${o.socket}, ${o.security},
               ${tx.json(disk as never)}, ${tx.json(vcpu as never)}, ${tx.json(memory as never)},
               ${o.sharedDisk ? tx.json(normaliseSpec(o.sharedDisk) as never) : null},
               ${need(vcpu)}, ${need(memory)}, ${need(disk)},
               ${o.internetSpeed ?? null}, ${o.interconnect ?? null}, ${o.interconnectType ?? null}, ${o.provisioningTime ?? null},
               ${Math.round(o.onDemand * 10_000)}, ${o.isVariable ?? false}, ${o.isSpot ?? false}, ${o.prepaidTime ?? null},
               ${o.images}, ${o.active ?? true}
        FROM (SELECT 1) one LEFT JOIN data_centers dc ON dc.id = ${o.dataCenterId}
        ON CONFLICT (id) DO ${
          upd
            ? tx`UPDATE SET cloud_id = EXCLUDED.cloud_id, gpu_type = EXCLUDED.gpu_type, gpu_count = EXCLUDED.gpu_count,
                 gpu_memory_gb = EXCLUDED.gpu_memory_gb, socket = EXCLUDED.socket, security = EXCLUDED.security,
                 disk_spec = EXCLUDED.disk_spec, vcpu_spec = EXCLUDED.vcpu_spec, memory_spec = EXCLUDED.memory_spec,
                 shared_disk_spec = EXCLUDED.shared_disk_spec, need_vcpus = EXCLUDED.need_vcpus, need_memory_gb = EXCLUDED.need_memory_gb,
                 need_disk_gb = EXCLUDED.need_disk_gb, internet_speed = EXCLUDED.internet_speed,
                 interconnect_gbps = EXCLUDED.interconnect_gbps, interconnect_type = EXCLUDED.interconnect_type,
                 provisioning_minutes = EXCLUDED.provisioning_minutes, on_demand_units = EXCLUDED.on_demand_units,
                 is_variable = EXCLUDED.is_variable, is_spot = EXCLUDED.is_spot, prepaid_hours = EXCLUDED.prepaid_hours,
                 images = EXCLUDED.images, active = EXCLUDED.active, updated_at = now()`
            : tx`NOTHING`
        }
        RETURNING (xmax = 0) AS inserted`);
    }
    for (const o of c.diskOffers ?? []) {
      tally(await tx<{ inserted: boolean }[]>`
        INSERT INTO disk_offers (id, provider_id, data_center_id, cloud_id, spec, security, is_multinode, capacity_gb, free_gb)
        SELECT ${o.id}, dc.provider_id, ${o.dataCenterId}, ${o.cloudId ?? null}, ${tx.json(normaliseSpec(o.spec) as never)},
               ${o.security}, ${o.isMultinode}, ${o.capacityGb}, ${o.capacityGb}
        FROM (SELECT 1) one LEFT JOIN data_centers dc ON dc.id = ${o.dataCenterId}
        ON CONFLICT (id) DO ${
          upd
            ? tx`UPDATE SET cloud_id = EXCLUDED.cloud_id, spec = EXCLUDED.spec, security = EXCLUDED.security,
                 is_multinode = EXCLUDED.is_multinode, free_gb = disk_offers.free_gb + EXCLUDED.capacity_gb - disk_offers.capacity_gb,
                 capacity_gb = EXCLUDED.capacity_gb`
            : tx`NOTHING`
        }
        RETURNING (xmax = 0) AS inserted`);
    }
  } catch (e) {
    // Rows naming a provider, data center, contract, node or cluster that does not exist.
    if (pgCode(e) === '23503' || pgCode(e) === '23502') {
      throw new ApiError('invalid', `inventory import refers to a row that does not exist: ${(e as Error).message}`, { param: 'body' });
    }
    if (pgCode(e) === '23514') throw conflict(`inventory import would shrink capacity below what pods hold: ${(e as Error).message}`);
    if (pgCode(e) === '23505') throw conflict(`inventory import conflicts with an existing row: ${(e as Error).message}`);
    throw e;
  }
  return { created, updated };
}

/** Admin import: the catalog rows plus an audit entry. */
export async function adminImport(sql: Sql, c: Catalog, actor: Actor): Promise<MutationResult> {
  const result = await sql.begin(async (tx) => {
    const operationId = newId();
    const r = await importCatalog(tx, c, 'update');
    const counts = Object.fromEntries(Object.entries(c).map(([k, v]) => [k, Array.isArray(v) ? v.length : 0]));
    await audit(tx, operationId, 'import', actor, null, { counts });
    return mutation(operationId, `imported ${r.created + r.updated} rows (${r.created} created, ${r.updated} updated)`, r);
  });
  // After commit, so no reader can cache the old definitions again meanwhile.
  forgetOffers();
  return result;
}

/** Ends the nodes' contract membership and their cluster assignments; rows stay as history. */
export async function detachContractNodes(sql: Sql, contractId: string, nodeIds: string[], actor: Actor, opts: { dryRun: boolean; reason: string | null }) {
  return sql.begin(async (tx) => {
    const [contract] = await tx<{ id: string; name: string }[]>`SELECT id, name FROM contracts WHERE id = ${contractId} FOR UPDATE`;
    if (!contract) throw notFound('contract', contractId);
    const unique = [...new Set(nodeIds)];
    const held = (
      await tx<{ id: string }[]>`SELECT id FROM nodes WHERE id = ANY(${unique}) AND contract_id = ${contractId} ORDER BY id FOR UPDATE`
    ).map((r) => r.id);
    const heldSet = new Set(held);
    const notInContract = unique.filter((n) => !heldSet.has(n));
    const operationId = newId();
    if (opts.dryRun) {
      const [live] = await tx<{ n: number }[]>`SELECT count(*)::int AS n FROM cluster_assignments WHERE node_id = ANY(${held}) AND ended_at IS NULL`;
      return mutation(operationId, `dry run: would detach ${held.length} nodes and end ${live!.n} assignments`, {
        targetId: contract.id,
        targetName: contract.name,
        detached: held.length,
        updated: live!.n,
        dryRun: true,
        notInContract,
      });
    }
    const now = new Date();
    await tx`UPDATE contract_nodes SET detached_at = ${now} WHERE node_id = ANY(${held}) AND contract_id = ${contractId} AND detached_at IS NULL`;
    await tx`UPDATE nodes SET contract_id = NULL, updated_at = ${now} WHERE id = ANY(${held})`;
    const ended = await tx<{ id: string }[]>`
      UPDATE cluster_assignments SET status = 'ENDED', ended_at = ${now}, updated_at = ${now}
      WHERE node_id = ANY(${held}) AND ended_at IS NULL RETURNING id`;
    await audit(tx, operationId, 'contract.nodes.detach', actor, contractId, {
      reason: opts.reason,
      nodeIds: held,
      endedAssignmentIds: ended.map((r) => r.id),
      notInContract,
    });
    return mutation(operationId, `detached ${held.length} nodes from contract ${contract.name}; ended ${ended.length} assignments`, {
      targetId: contract.id,
      targetName: contract.name,
      detached: held.length,
      updated: ended.length,
      dryRun: false,
      notInContract,
    });
  });
}

interface AssignmentRow {
  id: string;
  node_id: string;
  cluster_id: string;
  status: string;
  created_at: Date;
  updated_at: Date;
  ended_at: Date | null;
}

const assignmentRecord = (r: AssignmentRow) => ({
  id: r.id,
  nodeId: r.node_id,
  clusterId: r.cluster_id,
  status: r.status,
  createdAt: iso(r.created_at),
  updatedAt: iso(r.updated_at),
  endedAt: iso(r.ended_at),
});

/**
 * Removes assignment rows outright. With `expectedStatuses`, each row is read
 * again under its row lock and one whose status is not expected any more is
 * refused and named; the audit entry keeps a snapshot of every removed row.
 */
export async function bulkDeleteAssignments(sql: Sql, ids: string[], expectedStatuses: string[] | null, actor: Actor) {
  return sql.begin(async (tx) => {
    const unique = [...new Set(ids)];
    // Lock in id order so two bulk deletes over overlapping sets cannot deadlock.
    const rows = await tx<AssignmentRow[]>`SELECT * FROM cluster_assignments WHERE id = ANY(${unique}) ORDER BY id FOR UPDATE`;
    const found = new Set(rows.map((r) => r.id));
    const notFoundIds = unique.filter((i) => !found.has(i));
    const expected = expectedStatuses ? new Set(expectedStatuses) : null;
    const refused = expected ? rows.filter((r) => !expected.has(r.status)) : [];
    const doomed = expected ? rows.filter((r) => expected.has(r.status)) : rows;
    const operationId = newId();
    if (doomed.length) await tx`DELETE FROM cluster_assignments WHERE id = ANY(${doomed.map((r) => r.id)})`;
    await audit(tx, operationId, 'assignments.bulk_delete', actor, null, {
      expectedStatuses,
      deleted: doomed.map(assignmentRecord),
      refused: refused.map((r) => ({ id: r.id, status: r.status })),
      notFound: notFoundIds,
    });
    const parts = [`deleted ${doomed.length} of ${unique.length} assignments`];
    if (refused.length) parts.push(`${refused.length} refused because their status is no longer one of ${[...expected!].join(', ')}`);
    if (notFoundIds.length) parts.push(`${notFoundIds.length} not found`);
    return {
      complete: refused.length === 0 && notFoundIds.length === 0,
      result: mutation(operationId, parts.join('; '), {
        deleted: doomed.length,
        refused: refused.map((r) => ({ id: r.id, status: r.status, reason: `status is ${r.status}, expected one of ${[...expected!].join(', ')}` })),
        notFound: notFoundIds,
      }),
    };
  });
}

export async function setAssignmentStatus(sql: Sql, id: string, status: string) {
  const [row] = await sql<AssignmentRow[]>`
    UPDATE cluster_assignments SET status = ${status}, updated_at = now(),
      ended_at = CASE WHEN ${status} = 'ENDED' THEN COALESCE(ended_at, now()) ELSE NULL END
    WHERE id = ${id} RETURNING *`;
  if (!row) throw notFound('assignment', id);
  return assignmentRecord(row);
}

export async function listAssignments(sql: Sql, f: { ids: string[]; nodeId?: string; clusterId?: string }) {
  if (!f.ids.length && !f.nodeId && !f.clusterId) throw invalid('ids', 'give ids, node_id or cluster_id', null);
  const rows = await sql<AssignmentRow[]>`
    SELECT * FROM cluster_assignments
    WHERE true ${f.ids.length ? sql`AND id = ANY(${f.ids})` : sql``}
      ${f.nodeId ? sql`AND node_id = ${f.nodeId}` : sql``} ${f.clusterId ? sql`AND cluster_id = ${f.clusterId}` : sql``}
    ORDER BY created_at, id LIMIT 1000`;
  return rows.map(assignmentRecord);
}

export async function auditEntries(sql: Sql, operationId: string) {
  const rows = await sql<{ id: string; operation_id: string; action: string; actor_user_id: string | null; actor_key_id: string | null; target_id: string | null; detail: unknown; created_at: Date }[]>`
    SELECT * FROM inventory_audit WHERE operation_id = ${operationId} ORDER BY created_at, id`;
  return rows.map((r) => ({
    id: r.id,
    operationId: r.operation_id,
    action: r.action,
    actorUserId: r.actor_user_id,
    actorKeyId: r.actor_key_id,
    targetId: r.target_id,
    detail: r.detail,
    createdAt: iso(r.created_at),
  }));
}
