import type { Sql } from '../../db/index.js';
import { log } from '../../log.js';
import { counter } from '../../metrics.js';
import { chargeInference } from '../../money/inference-charges.js';

const charged = counter({ name: 'inference_charged_units_total', help: 'Inference charges posted to wallets, in USD x 10000', labelNames: ['model'] });
const teamTokens = counter({ name: 'inference_team_tokens_total', help: 'Tokens used by inference, by team (personal use is team="")', labelNames: ['team', 'direction'] });

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

export class Charger {
  private readonly tallies = new Map<string, Tally>();
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> = Promise.resolve();

  constructor(
    private readonly sql: Sql,
    private readonly flushIntervalMs: number,
    private readonly onPosted: (walletId: string, units: number) => void = () => {},
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.flush(), this.flushIntervalMs);
    this.timer.unref();
  }

  add(c: ChargeItem): void {
    const key = `${c.walletId}\u0000${c.model}`;
    let t = this.tallies.get(key);
    if (!t) {
      t = { walletId: c.walletId, model: c.model, numerator: 0, postedUnits: 0, requests: 0, runUsage: new Map() };
      this.tallies.set(key, t);
    }
    t.numerator += Math.round(c.inputPricePerMTok * PRICE_SCALE) * c.inputTokens + Math.round(c.outputPricePerMTok * PRICE_SCALE) * c.outputTokens;
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
    this.flushing = this.flushing.then(() => this.flushOnce(final)).catch((e) => log.error({ err: e }, 'inference charge flush failed; will retry'));
    return this.flushing;
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
    if (items.length === 0 && runs.length === 0) return;
    const runSnapshot = [...this.tallies.values()].map((t) => [t, new Map(t.runUsage)] as const);
    for (const t of this.tallies.values()) t.runUsage.clear();
    try {
      await chargeInference(this.sql, items, runs);
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

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await this.flush(true);
  }
}
