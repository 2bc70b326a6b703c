import type { Sql } from '../db/index.js';
import { invalid } from '../errors.js';
import type { Ctx } from '../http/context.js';
import { platformRoute, type Route } from '../http/router.js';
import { parse } from '../http/validate.js';
import { queryBool, queryList, queryStr } from './common.js';
import { forceTerminateDisk } from './disks.js';
import { adminImport, auditEntries, bulkDeleteAssignments, detachContractNodes, listAssignments, setAssignmentStatus, type Actor } from './inventory.js';
import { BulkDeleteAssignmentsBody, CatalogBody, DetachNodesBody, INVENTORY_IDS_MAX, PatchAssignmentBody } from './protocol.js';
import type { Providers } from './providers/index.js';
import { adminUserTeams } from './teams.js';

// Admin routes of the platform (SPEC 4.7: disks, users, inventory), answering
// `{data, status}`. Scopes: admin:disks, admin:users, admin:inventory (admin:* covers all).

/** A whole-catalog import can carry 1000 rows of each kind; 4 MiB holds that with room. */
const IMPORT_BODY_BYTES_MAX = 4 << 20;
/** The reason given with a detach is kept in the audit entry; a sentence, not a document. */
const REASON_CHARS_MAX = 1000;

const actorOf = (ctx: Ctx): Actor => ({ userId: ctx.principal.userId, keyId: ctx.principal.keyId });

export function adminRoutes(sql: Sql, providers: Providers): Route[] {
  const r = platformRoute;
  const ok = (data: unknown, status: string | null = 'success', code = 200) => ({ status: code, body: { data, status } });

  return [
    r('DELETE', '/api/admin/disks/:diskId/force', 'admin:disks', async (ctx) => ok(await forceTerminateDisk(sql, providers, ctx.params.diskId!))),

    r('GET', '/api/admin/users/:userId/teams', 'admin:users', async (ctx) =>
      ok(await adminUserTeams(sql, ctx.params.userId!, { userId: ctx.principal.userId, all: ctx.principal.permissions.has('admin:*') })),
    ),

    r('POST', '/api/admin/inventory/contracts/:contractId/nodes/detach', 'admin:inventory', async (ctx) => {
      const b = parse(DetachNodesBody, await ctx.json());
      // Query parameters (names not in the spec): dry_run (or dryRun) and reason.
      const dryRun = queryBool(ctx.query, 'dry_run') ?? queryBool(ctx.query, 'dryRun') ?? false;
      const reason = queryStr(ctx.query, 'reason', REASON_CHARS_MAX) ?? null;
      return ok(await detachContractNodes(sql, ctx.params.contractId!, b.nodeIds, actorOf(ctx), { dryRun, reason }));
    }),

    r('POST', '/api/admin/inventory/assignments/bulk-delete', 'admin:inventory', async (ctx) => {
      const b = parse(BulkDeleteAssignmentsBody, await ctx.json());
      const { complete, result } = await bulkDeleteAssignments(sql, b.assignmentIds, b.expectedStatuses ?? null, actorOf(ctx));
      // Refused or unknown rows are named in the result; `partial` says some were not deleted.
      return ok(result, complete ? 'success' : 'partial');
    }),

    // ---- extensions: inventory import and inspection ----
    r('POST', '/api/admin/inventory/import', 'admin:inventory', async (ctx) => ok(await adminImport(sql, parse(CatalogBody, await ctx.json()), actorOf(ctx))), {
      bodyBytesMax: IMPORT_BODY_BYTES_MAX,
    }),
    r('GET', '/api/admin/inventory/assignments', 'admin:inventory', async (ctx) =>
      ok(
        await listAssignments(sql, {
          ids: queryList(ctx.query, 'ids', INVENTORY_IDS_MAX),
          nodeId: queryStr(ctx.query, 'node_id'),
          clusterId: queryStr(ctx.query, 'cluster_id'),
        }),
      ),
    ),
    r('PATCH', '/api/admin/inventory/assignments/:assignmentId', 'admin:inventory', async (ctx) => {
      const b = parse(PatchAssignmentBody, await ctx.json());
      return ok(await setAssignmentStatus(sql, ctx.params.assignmentId!, b.status));
    }),
    r('GET', '/api/admin/inventory/audit', 'admin:inventory', async (ctx) => {
      const op = queryStr(ctx.query, 'operation_id');
      if (!op) throw invalid('operation_id', 'is required', null);
      return ok(await auditEntries(sql, op));
    }),
  ];
}
