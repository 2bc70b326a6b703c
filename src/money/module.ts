import type { Module } from '../app.js';
import { log } from '../log.js';
import { sweepIdempotencyKeys } from './idempotency.js';
import { INVOICER_INTERVAL_MS, issueMonthly } from './invoices.js';
import { Meter } from './meter.js';
import { moneyRoutes } from './routes.js';

// Money as a daemon module: the meter loop (at start, every METER_INTERVAL_MS,
// and once more at shutdown), hourly housekeeping (monthly invoices, expired
// idempotency keys), and the money routes.
/** How long a stop waits for the last meter run. */
const METER_STOP_WAIT_MS = 1_500;

export const moneyModule: Module = {
  name: 'money',
  async init(s) {
    const meter = new Meter(s.sql, s.config.METER_INTERVAL_MS);
    meter.start();
    const housekeeping = async () => {
      try {
        await issueMonthly(s.sql);
        await sweepIdempotencyKeys(s.sql);
      } catch (e) {
        log.error({ err: e }, 'money housekeeping failed; retrying next hour');
      }
    };
    void housekeeping();
    const timer = setInterval(() => void housekeeping(), INVOICER_INTERVAL_MS);
    timer.unref();
    s.onShutdown(async () => {
      clearInterval(timer);
      // Bounded: meters live in the database, so a last run that cannot reach it loses nothing
      // (the next start charges the interval); waiting longer would only overrun the stop budget.
      const done = await Promise.race([meter.stop().then(() => true, () => false), new Promise<boolean>((r) => setTimeout(() => r(false), METER_STOP_WAIT_MS).unref())]);
      if (!done) log.warn('last meter run did not finish at stop; the next start charges its interval');
    });
    return { platform: moneyRoutes(s.sql) };
  },
};
