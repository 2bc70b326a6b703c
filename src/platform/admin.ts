import type { Sql } from '../db/index.js';
import type { Ctx } from '../http/context.js';
import { adminEnvelope, platformRoute, routeDoc as doc, type Route } from '../http/router.js';
import { parse } from '../http/validate.js';
import { forceTerminateDisk } from './disks.js';
import { adminImport, auditEntries, bulkDeleteAssignments, detachContractNodes, listAssignments, setAssignmentStatus, type Actor } from './inventory.js';
import {
  AdminUserTeams,
  Assignment,
  AssignmentList,
  AssignmentsQuery,
  AuditEntryList,
  AuditQuery,
  BulkDeleteAssignmentsBody,
  BulkDeleteResult,
  CatalogBody,
  DetachNodesBody,
  DetachQuery,
  DetachNodesResult,
  DiskForceTerminated,
  ImportResult,
  PatchAssignmentBody,
} from './protocol.js';
import type { Providers } from './providers/index.js';
import { adminUserTeams } from './teams.js';

// Admin routes of the platform (SPEC 4.7: disks, users, inventory), answering
// `{data, status}`. Scopes: admin:disks, admin:users, admin:inventory (admin:* covers all).

/** A whole-catalog import can carry 1000 rows of each kind; 4 MiB holds that with room. */
const IMPORT_BODY_BYTES_MAX = 4 << 20;

const actorOf = (ctx: Ctx): Actor => ({ userId: ctx.principal.userId, keyId: ctx.principal.keyId });

export function adminRoutes(sql: Sql, providers: Providers): Route[] {
  const r = platformRoute;
  const ok = (data: unknown, status: string | null = 'success', code = 200) => ({ status: code, body: { data, status } });

  const envelope = adminEnvelope;
  return [
    r('DELETE', '/api/admin/disks/:diskId/force', 'admin:disks', doc('admin', 'Terminates a disk whatever its state', { 200: envelope(DiskForceTerminated) }), async (ctx) =>
      ok(await forceTerminateDisk(sql, providers, ctx.params.diskId!)),
    ),

    r('GET', '/api/admin/users/:userId/teams', 'admin:users', doc('admin', "A user's teams", { 200: envelope(AdminUserTeams) }), async (ctx) =>
      ok(await adminUserTeams(sql, ctx.params.userId!, { userId: ctx.principal.userId, all: ctx.principal.permissions.has('admin:*') })),
    ),

    r(
      'POST',
      '/api/admin/inventory/contracts/:contractId/nodes/detach',
      'admin:inventory',
      doc('admin', "Detaches nodes from a contract (dry_run: says what would change)", { 200: envelope(DetachNodesResult) }, { body: DetachNodesBody, query: DetachQuery }),
      async (ctx) => {
        const b = parse(DetachNodesBody, await ctx.json());
        const q = ctx.queryOf(DetachQuery);
        return ok(await detachContractNodes(sql, ctx.params.contractId!, b.nodeIds, actorOf(ctx), { dryRun: q.dry_run ?? q.dryRun ?? false, reason: q.reason ?? null }));
      },
    ),

    r(
      'POST',
      '/api/admin/inventory/assignments/bulk-delete',
      'admin:inventory',
      doc('admin', 'Deletes assignments; status partial when some were refused', { 200: envelope(BulkDeleteResult, ['success', 'partial']) }, { body: BulkDeleteAssignmentsBody }),
      async (ctx) => {
        const b = parse(BulkDeleteAssignmentsBody, await ctx.json());
        const { complete, result } = await bulkDeleteAssignments(sql, b.assignmentIds, b.expectedStatuses ?? null, actorOf(ctx));
        // Refused or unknown rows are named in the result; `partial` says some were not deleted.
        return ok(result, complete ? 'success' : 'partial');
      },
    ),

    // ---- extensions: inventory import and inspection ----
    r('POST', '/api/admin/inventory/import', 'admin:inventory', doc('admin', 'Imports a catalog of contracts, clusters and nodes', { 200: envelope(ImportResult) }, { body: CatalogBody }), async (ctx) =>
      ok(await adminImport(sql, parse(CatalogBody, await ctx.json()), actorOf(ctx))),
      { bodyBytesMax: IMPORT_BODY_BYTES_MAX },
    ),
    r('GET', '/api/admin/inventory/assignments', 'admin:inventory', doc('admin', 'Assignments by id, node or cluster', { 200: envelope(AssignmentList) }, { query: AssignmentsQuery }), async (ctx) => {
      const q = ctx.queryOf(AssignmentsQuery);
      return ok(await listAssignments(sql, { ids: q.ids, nodeId: q.node_id, clusterId: q.cluster_id }));
    }),
    r('PATCH', '/api/admin/inventory/assignments/:assignmentId', 'admin:inventory', doc('admin', "Sets an assignment's status", { 200: envelope(Assignment) }, { body: PatchAssignmentBody }), async (ctx) => {
      const b = parse(PatchAssignmentBody, await ctx.json());
      return ok(await setAssignmentStatus(sql, ctx.params.assignmentId!, b.status));
    }),
    r('GET', '/api/admin/inventory/audit', 'admin:inventory', doc('admin', 'The audit entries of one operation', { 200: envelope(AuditEntryList) }, { query: AuditQuery }), async (ctx) =>
      ok(await auditEntries(sql, ctx.queryOf(AuditQuery).operation_id)),
    ),
  ];
}
