import type { Sql } from '../db/index.js';
import { ApiError, invalid } from '../errors.js';
import type { Query } from '../http/context.js';
import { platformRoute, type Route } from '../http/router.js';
import { parse } from '../http/validate.js';
import { idempotencyKey } from './idempotency.js';
import { cancelInvoice, issueInvoice, listInvoices, payInvoice } from './invoices.js';
import { CreateRunBody, PatchRunBody, RecordUsageBody, TopupBody } from './protocol.js';
import { createRun, recordAdminUsage, runUsage, setRunStatus } from './rft.js';
import { topup } from './topup.js';
import { walletView } from './wallet.js';

// Money routes: admin top-up (SPEC 4.7), invoices (3.5, 4.7), RFT runs (2.6,
// 4.5) and the caller's wallet. Admin routes answer `{data, status}`.

/** The Prime CLI asks for 20 billings by default; 100 bounds one answer. */
const BILLINGS_LIMIT_DEFAULT = 20;
const BILLINGS_LIMIT_MAX = 100;
/** Deeper offsets are a scan no real client pages through. */
const OFFSET_MAX = 1_000_000;

function queryInt(q: Query, name: string, def: number, min: number, max: number): number {
  const raw = q.get(name);
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw.trim())) throw invalid(name, 'must be a non-negative integer', raw);
  const n = Number(raw);
  if (n < min || n > max) throw invalid(name, `must be between ${min} and ${max}`, raw);
  return n;
}

export function moneyRoutes(sql: Sql): Route[] {
  const r = platformRoute;
  const ok = (data: unknown, status = 200) => ({ status, body: { data, status: 'success' } });

  return [
    r('POST', '/api/admin/transactions/topup', 'admin:wallets', async (ctx) => {
      const b = parse(TopupBody, await ctx.json());
      if (!b.userId === !b.teamId) {
        // Exactly one names the owner; the refusal names both fields.
        const rule = b.userId ? 'exactly one of userId and teamId names the wallet owner, both were sent' : 'exactly one of userId and teamId is required';
        const issues = (['userId', 'teamId'] as const).map((f) => ({ param: f, details: `${f}: ${rule} (got ${JSON.stringify(b[f] ?? null)})` }));
        throw new ApiError('invalid', issues[0]!.details, { param: 'userId', issues });
      }
      const a = await topup(sql, ctx.principal.userId, b, idempotencyKey(ctx.header('idempotency-key')));
      return { status: a.status, raw: a.json, contentType: 'application/json', headers: a.replayed ? { 'idempotent-replayed': 'true' } : undefined };
    }),

    // ---- invoices ----
    r('POST', '/api/admin/invoices/:walletId', 'admin:invoices', async (ctx) => {
      const inv = await issueInvoice(sql, ctx.params.walletId!);
      if (!inv) throw new ApiError('conflict', `wallet ${ctx.params.walletId} has no charges since its last invoice; nothing to invoice`, { param: 'wallet_id' });
      return ok(inv, 201);
    }),
    r('GET', '/api/admin/invoices/:walletId', 'admin:invoices', async (ctx) => ok(await listInvoices(sql, ctx.params.walletId!))),
    r('POST', '/api/admin/invoices/:walletId/:invoiceId/cancel', 'admin:invoices', async (ctx) => {
      await cancelInvoice(sql, ctx.params.walletId!, ctx.params.invoiceId!);
      return ok({});
    }),
    r('POST', '/api/admin/invoices/:walletId/:invoiceId/pay', 'admin:invoices', async (ctx) => ok(await payInvoice(sql, ctx.params.walletId!, ctx.params.invoiceId!))),

    // ---- RFT runs ----
    r('POST', '/api/admin/rft/runs', 'admin:wallets', async (ctx) => ok(await createRun(sql, parse(CreateRunBody, await ctx.json())), 201)),
    r('PATCH', '/api/admin/rft/runs/:runId', 'admin:wallets', async (ctx) => ok(await setRunStatus(sql, ctx.params.runId!, parse(PatchRunBody, await ctx.json()).status))),
    r('POST', '/api/admin/rft/runs/:runId/usage', 'admin:wallets', async (ctx) =>
      ok(await recordAdminUsage(sql, ctx.params.runId!, parse(RecordUsageBody, await ctx.json()))),
    ),
    r('GET', '/api/v1/billing/runs/:runId/usage', 'billing:read', async (ctx) => ({ body: await runUsage(sql, ctx.params.runId!, ctx.principal.userId) })),

    // ---- the caller's wallet ----
    r('GET', '/api/v1/billing/wallet', 'billing:read', async (ctx) => {
      const q = ctx.query;
      const teamId = q.get('teamId') || q.get('team_id') || null;
      const page = { limit: queryInt(q, 'limit', BILLINGS_LIMIT_DEFAULT, 1, BILLINGS_LIMIT_MAX), offset: queryInt(q, 'offset', 0, 0, OFFSET_MAX) };
      return { body: await walletView(sql, ctx.principal.userId, teamId, page) };
    }),
  ];
}
