import type { Sql } from '../../db/index.js';
import { log } from '../../log.js';
import { counter } from '../../metrics.js';
import { chargeInference, type InferenceCharge, type RunUsage } from '../../money/inference-charges.js';
import type { Tx } from '../../db/index.js';
import { splitTallyKey, tallyKey, type ChargeJournal, type JournalEntry, type Remainders } from './charge-journal.js';

const charged = counter({ name: 'inference_charged_units_total', help: 'Inference charges posted to wallets, in USD x 10000', labelNames: ['model'] }, 'inference');
const teamTokens = counter({ name: 'inference_team_tokens_total', help: 'Tokens used by inference, by team (personal use is team="")', labelNames: ['team', 'direction'] }, 'inference');

/**
 * Inference usage becomes ledger charges off the hot path: requests add to an
 * in-memory tally per (wallet, model) and a timer posts the tally in one
 * transaction. Costs are kept exactly, in units of 1e-8 USD x 10000 (prices are
 * USD per million tokens with up to 6 decimals); only whole ledger units are
 * posted and the remainder carries over, so the ledger never drifts from
 * tokens x prices by a unit or more per wallet and model.
 */
export const PRICE_SCALE = 1_000_000; // price per MTok as integer micro-USD
const NUM_PER_UNIT = 100_000_000; // units = priceMicro x tokens / 1e8

interface Tally {
  walletId: string;
  model: string;
  numerator: number; // priceMicro x tokens, summed
  postedUnits: number;
  requests: number;
  runUsage: Map<string, { input: number; output: number }>;
}

export interface ChargeItem {
  walletId: string;
  teamId: string | null;
  model: string;
  inputTokens: number;
  outputTokens: number;
  inputPricePerMTok: number;
  outputPricePerMTok: number;
  runId: string | null;
}

/** How long a stop keeps retrying the final flush against an unreachable database, at most. */
export const STOP_FLUSH_RETRY_MS = 2_500;
/** One flush attempt at stop: a database that does not answer in this long counts as down. */
const STOP_FLUSH_ATTEMPT_MS = 1_000;

/**
 * Posts journal entries left by a previous run over the remainders carried then, rounding each
 * wallet and model's total to the nearest unit (what a clean stop does); returns the units posted.
 */
export async function postJournalEntries(tx: Tx, entries: JournalEntry[], from: Remainders): Promise<number> {
  const numer = new Map<string, { walletId: string; model: string; n: number; requests: number }>();
  const runs = new Map<string, { input: number; output: number }>();
  for (const [k, n] of Object.entries(from)) {
    const [walletId, model] = splitTallyKey(k);
    numer.set(k, { walletId, model, n, requests: 0 });
  }
  for (const e of entries) {
    const k = tallyKey(e.w, e.m);
    const t = numer.get(k) ?? { walletId: e.w, model: e.m, n: 0, requests: 0 };
    t.n += e.n;
    t.requests++;
    numer.set(k, t);
    if (e.r) {
      const u = runs.get(e.r) ?? { input: 0, output: 0 };
      u.input += e.i;
      u.output += e.o;
      runs.set(e.r, u);
    }
  }
  const items: InferenceCharge[] = [];
  for (const t of numer.values()) {
    const units = Math.round(t.n / NUM_PER_UNIT);
    if (units > 0) items.push({ walletId: t.walletId, amountUnits: units, refId: t.model, description: `inference on ${t.model}: ${t.requests} request(s), from the charge journal of a previous run` });
  }
  const runList: RunUsage[] = [...runs].map(([runId, u]) => ({ runId, ...u }));
  await chargeInference(tx, items, runList);
  return items.reduce((a, i) => a + i.amountUnits, 0);
}

export class Charger {
  private readonly tallies = new Map<string, Tally>();
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> = Promise.resolve();

  constructor(
    private readonly sql: Sql,
    private readonly flushIntervalMs: number,
    private readonly journal: ChargeJournal,
    private readonly onPosted: (walletId: string, units: number) => void = () => {},
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.flush(), this.flushIntervalMs);
    this.timer.unref();
  }

  /** Journals the request's cost (before its answer is complete), then tallies it for the next flush. */
  add(c: ChargeItem): void {
    const key = tallyKey(c.walletId, c.model);
    let t = this.tallies.get(key);
    if (!t) {
      t = { walletId: c.walletId, model: c.model, numerator: 0, postedUnits: 0, requests: 0, runUsage: new Map() };
      this.tallies.set(key, t);
    }
    const n = Math.round(c.inputPricePerMTok * PRICE_SCALE) * c.inputTokens + Math.round(c.outputPricePerMTok * PRICE_SCALE) * c.outputTokens;
    this.journal.append({ w: c.walletId, m: c.model, n, r: c.runId, i: c.inputTokens, o: c.outputTokens });
    t.numerator += n;
    t.requests++;
    if (c.runId) {
      const u = t.runUsage.get(c.runId) ?? { input: 0, output: 0 };
      u.input += c.inputTokens;
      u.output += c.outputTokens;
      t.runUsage.set(c.runId, u);
    }
    const team = c.teamId ?? '';
    teamTokens.inc({ team, direction: 'input' }, c.inputTokens);
    teamTokens.inc({ team, direction: 'output' }, c.outputTokens);
  }

  /** Posts every whole unit owed. Serialised: one flush at a time. */
  flush(final = false): Promise<void> {
    return this.chain(final).catch(() => {});
  }

  /**
   * One flush after every flush before it (two at once would post the same units twice);
   * the returned promise rejects when this one fails, the chain itself never does.
   */
  private chain(final: boolean): Promise<void> {
    const p = this.flushing.then(() => this.flushOnce(final));
    this.flushing = p.catch((e) => log.error({ err: e }, 'inference charge flush failed; will retry'));
    return p;
  }

  private async flushOnce(final: boolean): Promise<void> {
    const items: Array<{ walletId: string; amountUnits: number; refId: string; description: string }> = [];
    const runs: Array<{ runId: string; input: number; output: number }> = [];
    const updates: Array<[Tally, number]> = [];
    for (const t of this.tallies.values()) {
      // At shutdown the sub-unit remainder is rounded to the nearest unit, so it is neither lost nor invented beyond half a unit.
      const owed = final ? Math.round(t.numerator / NUM_PER_UNIT) : Math.floor(t.numerator / NUM_PER_UNIT);
      const units = owed - t.postedUnits;
      if (units > 0) {
        items.push({ walletId: t.walletId, amountUnits: units, refId: t.model, description: `inference on ${t.model}: ${t.requests} request(s)` });
        updates.push([t, units]);
      }
      for (const [runId, u] of t.runUsage) runs.push({ runId, ...u });
    }
    const mark = this.journal.mark();
    if (items.length === 0 && runs.length === 0 && !this.journal.retiringPending) return;
    // What stays owed below a unit, per wallet and model, after this flush: the journal's checkpoint.
    const posting = new Map(updates);
    const remainders: Remainders = {};
    for (const [k, t] of this.tallies) {
      const rest = t.numerator - (t.postedUnits + (posting.get(t) ?? 0)) * NUM_PER_UNIT;
      if (rest !== 0) remainders[k] = rest;
    }
    const runSnapshot = [...this.tallies.values()].map((t) => [t, new Map(t.runUsage)] as const);
    for (const t of this.tallies.values()) t.runUsage.clear();
    try {
      await this.sql.begin(async (tx) => {
        await chargeInference(tx, items, runs);
        await this.journal.checkpoint(tx, mark, remainders);
      });
      this.journal.committed(mark);
    } catch (e) {
      // Put run usage back; whole units stay owed since postedUnits did not move.
      for (const [t, snap] of runSnapshot) for (const [k, v] of snap) {
        const cur = t.runUsage.get(k) ?? { input: 0, output: 0 };
        t.runUsage.set(k, { input: cur.input + v.input, output: cur.output + v.output });
      }
      throw e;
    }
    for (const [t, units] of updates) {
      t.postedUnits += units;
      t.requests = 0;
      charged.inc({ model: t.model }, units);
      this.onPosted(t.walletId, units);
    }
  }

  /**
   * The last flush, retried for up to STOP_FLUSH_RETRY_MS. When the database cannot take it,
   * the charges stay in the journal on disk (posted at the next start) and this resolves with
   * `kept`; it throws only when they could not be kept either.
   */
  async stop(): Promise<{ posted: boolean }> {
    if (this.timer) clearInterval(this.timer);
    const deadline = Date.now() + STOP_FLUSH_RETRY_MS;
    for (;;) {
      try {
        // Chained: a periodic flush still in flight finishes first; the timeout bounds only our wait.
        await withTimeout(this.chain(true), STOP_FLUSH_ATTEMPT_MS);
        await withTimeout(this.journal.close(this.sql), STOP_FLUSH_ATTEMPT_MS);
        return { posted: true };
      } catch (e) {
        if (Date.now() + STOP_FLUSH_ATTEMPT_MS > deadline) {
          this.journal.keep();
          const owed = [...this.tallies.values()].reduce((a, t) => a + Math.max(0, Math.round(t.numerator / NUM_PER_UNIT) - t.postedUnits), 0);
          log.warn({ err: e, units: owed, journal: this.journal.id }, 'database unreachable at stop: inference charges kept in the journal, posted at the next start');
          return { posted: false };
        }
        await new Promise((r) => setTimeout(r, 250));
      }
    }
  }
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  return Promise.race([p, new Promise<never>((_, fail) => (t = setTimeout(() => fail(new Error(`no answer within ${ms} ms`)), ms)))]).finally(() => clearTimeout(t));
}
