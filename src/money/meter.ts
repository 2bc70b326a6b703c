import type { Sql } from '../db/index.js';
import { log } from '../log.js';
import { counter, histogram } from '../metrics.js';
import { settleMeters, type MeterCharge } from './ledger.js';

// The meter loop: every interval, every meter with unbilled time is charged up
// to now (pods and disks, opened and closed by the platform through
// openMeter/closeMeter). Exactly once comes from settleMeters (charges move a
// meter to a target that depends on time only, under the meter's row lock);
// this file decides which wallets to visit and how to lock them.

/**
 * Wallets locked together in one transaction. Large enough that a tick over
 * thousands of pods is a few dozen transactions, small enough that a batch
 * holds its wallet rows for milliseconds (top-ups and inference charges queue on them).
 */
const WALLETS_PER_TX = 100;
/** One tick visits at most this many wallets; the rest wait for the next tick (bounds one tick's work). */
const WALLETS_PER_TICK_MAX = 50_000;

const runs = counter({ name: 'meter_runs_total', help: 'Meter loop runs, by outcome', labelNames: ['outcome'] }, 'platform');
const runSeconds = histogram({ name: 'meter_run_seconds', help: 'Duration of one meter loop run', buckets: [0.001, 0.005, 0.02, 0.1, 0.5, 2, 10] }, 'platform');

export interface MeterRun {
  wallets: number;
  charges: MeterCharge[];
}

export class Meter {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> = Promise.resolve();
  private stopped = false;

  constructor(
    private readonly sql: Sql,
    private readonly intervalMs: number,
    private readonly clock: () => Date = () => new Date(),
  ) {}

  /** Runs once now (catching up after a restart), then every interval. */
  start(): void {
    void this.tick();
    this.timer = setInterval(() => void this.tick(), this.intervalMs);
    this.timer.unref();
  }

  /** Stops the timer and charges up to now one last time (shutdown). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await this.running.catch(() => {});
    await this.runOnce();
  }

  private tick(): Promise<unknown> {
    if (this.stopped) return this.running;
    // Serialised: a slow run delays the next instead of overlapping it.
    this.running = this.running.then(() => this.runOnce()).catch(() => {});
    return this.running;
  }

  /** Charges every due meter up to `now`. Safe to call concurrently from any number of processes. */
  async runOnce(now: Date = this.clock()): Promise<MeterRun> {
    const end = runSeconds.startTimer();
    try {
      const due = await this.sql<{ wallet_id: string }[]>`
        SELECT DISTINCT wallet_id FROM meters
        WHERE (ended_at IS NULL OR metered_until < ended_at) AND metered_until < ${now}
        LIMIT ${WALLETS_PER_TICK_MAX}`;
      const ids = due.map((r) => r.wallet_id).sort();
      const charges: MeterCharge[] = [];
      const busy: string[] = [];
      // First pass: the wallets no one else holds, many per transaction; a
      // transaction that never waits while holding locks cannot deadlock.
      for (let i = 0; i < ids.length; i += WALLETS_PER_TX) {
        const chunk = ids.slice(i, i + WALLETS_PER_TX);
        await this.sql.begin(async (tx) => {
          const locked = (await tx<{ id: string }[]>`
            SELECT id FROM wallets WHERE id = ANY(${chunk}::text[]) ORDER BY id FOR UPDATE SKIP LOCKED`).map((r) => r.id);
          const got = new Set(locked);
          for (const id of chunk) if (!got.has(id)) busy.push(id);
          if (locked.length) charges.push(...(await settleMeters(tx, { walletIds: locked }, now)));
        });
      }
      // Then the busy ones, one per transaction, waiting for the wallet while holding nothing else.
      for (const id of busy) {
        await this.sql.begin(async (tx) => {
          await tx`SELECT 1 FROM wallets WHERE id = ${id} FOR UPDATE`;
          charges.push(...(await settleMeters(tx, { walletIds: [id] }, now)));
        });
      }
      runs.inc({ outcome: 'ok' });
      return { wallets: ids.length, charges };
    } catch (e) {
      runs.inc({ outcome: 'error' });
      log.error({ err: e }, 'meter run failed; the next run charges what this one did not');
      throw e;
    } finally {
      end();
    }
  }
}
