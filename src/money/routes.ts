import type { Sql } from '../db/index.js';
import { ApiError } from '../errors.js';
import { adminEnvelope, platformRoute, routeDoc as doc, type Route } from '../http/router.js';
import { parse } from '../http/validate.js';
import { idempotencyKey } from './idempotency.js';
import { cancelInvoice, issueInvoice, listInvoices, payInvoice } from './invoices.js';
import { CreateRunBody, Empty, Invoice, InvoiceList, PatchRunBody, RecordUsageBody, Run, RunUsage, Topup, TopupBody, WalletQuery, WalletView } from './protocol.js';
import { createRun, recordAdminUsage, runUsage, setRunStatus } from './rft.js';
import { topup } from './topup.js';
import { walletView } from './wallet.js';

// Money routes: admin top-up (SPEC 4.7), invoices (3.5, 4.7), RFT runs (2.6,
// 4.5) and the caller's wallet. Admin routes answer `{data, status}`.

export function moneyRoutes(sql: Sql): Route[] {
  const r = platformRoute;
  const ok = (data: unknown, status = 200) => ({ status, body: { data, status: 'success' } });

  const envelope = adminEnvelope;
  return [
    r(
      'POST',
      '/api/admin/transactions/topup',
      'admin:wallets',
      doc('admin', "Credits (or debits) a user's or team's wallet; Idempotency-Key makes a retry safe", { 200: envelope(Topup) }, { body: TopupBody, headers: { 'idempotency-key': 'a retry with the same key and body answers the first result (idempotent-replayed: true) instead of posting again' } }),
      async (ctx) => {
        const b = parse(TopupBody, await ctx.json());
        if (!b.userId === !b.teamId) {
          // Exactly one names the owner; the refusal names both fields.
          const rule = b.userId ? 'exactly one of userId and teamId names the wallet owner, both were sent' : 'exactly one of userId and teamId is required';
          const issues = (['userId', 'teamId'] as const).map((f) => ({ param: f, details: `${f}: ${rule} (got ${JSON.stringify(b[f] ?? null)})` }));
          throw new ApiError('invalid', issues[0]!.details, { param: 'userId', issues });
        }
        const a = await topup(sql, ctx.principal.userId, b, idempotencyKey(ctx.header('idempotency-key')));
        return { status: a.status, raw: a.json, contentType: 'application/json', headers: a.replayed ? { 'idempotent-replayed': 'true' } : undefined };
      },
    ),

    // ---- invoices ----
    r('POST', '/api/admin/invoices/:walletId', 'admin:invoices', doc('admin', "Invoices a wallet's charges since its last invoice", { 201: envelope(Invoice) }), async (ctx) => {
      const inv = await issueInvoice(sql, ctx.params.walletId!);
      if (!inv) throw new ApiError('conflict', `wallet ${ctx.params.walletId} has no charges since its last invoice; nothing to invoice`, { param: 'wallet_id' });
      return ok(inv, 201);
    }),
    r('GET', '/api/admin/invoices/:walletId', 'admin:invoices', doc('admin', "A wallet's invoices", { 200: envelope(InvoiceList) }), async (ctx) => ok(await listInvoices(sql, ctx.params.walletId!))),
    r('POST', '/api/admin/invoices/:walletId/:invoiceId/cancel', 'admin:invoices', doc('admin', 'Voids an open invoice', { 200: envelope(Empty) }), async (ctx) => {
      await cancelInvoice(sql, ctx.params.walletId!, ctx.params.invoiceId!);
      return ok({});
    }),
    r('POST', '/api/admin/invoices/:walletId/:invoiceId/pay', 'admin:invoices', doc('admin', 'Marks an invoice paid', { 200: envelope(Invoice) }), async (ctx) =>
      ok(await payInvoice(sql, ctx.params.walletId!, ctx.params.invoiceId!)),
    ),

    // ---- RFT runs ----
    r('POST', '/api/admin/rft/runs', 'admin:wallets', doc('admin', 'Creates an RFT run billed to a wallet', { 201: envelope(Run) }, { body: CreateRunBody }), async (ctx) =>
      ok(await createRun(sql, parse(CreateRunBody, await ctx.json())), 201),
    ),
    r('PATCH', '/api/admin/rft/runs/:runId', 'admin:wallets', doc('admin', "Sets a run's status", { 200: envelope(Run) }, { body: PatchRunBody }), async (ctx) =>
      ok(await setRunStatus(sql, ctx.params.runId!, parse(PatchRunBody, await ctx.json()).status)),
    ),
    r('POST', '/api/admin/rft/runs/:runId/usage', 'admin:wallets', doc('admin', "Records a run's token usage (charged once per usage id)", { 200: envelope(RunUsage) }, { body: RecordUsageBody }), async (ctx) =>
      ok(await recordAdminUsage(sql, ctx.params.runId!, parse(RecordUsageBody, await ctx.json()))),
    ),
    r('GET', '/api/v1/billing/runs/:runId/usage', 'billing:read', doc('billing', "A run's usage and cost", { 200: RunUsage }), async (ctx) => ({
      body: await runUsage(sql, ctx.params.runId!, ctx.principal.userId),
    })),

    // ---- the caller's wallet ----
    r('GET', '/api/v1/billing/wallet', 'billing:read', doc('billing', "The caller's wallet (or a team's, for its members) and its billings", { 200: WalletView }, { query: WalletQuery }), async (ctx) => {
      const q = ctx.queryOf(WalletQuery);
      return { body: await walletView(sql, ctx.principal.userId, q.teamId ?? q.team_id ?? null, { limit: q.limit, offset: q.offset }) };
    }),
  ];
}
