import postgres from 'postgres';
import { bounded, Liveness } from './bounded.js';

/** Seconds to establish a connection: a stalled server must not hold the pool (see bounded.ts). */
const CONNECT_TIMEOUT_S = 2;

// One pool per process. bigint (int8) columns hold money in USD x 10000 and
// counts; they are parsed to JS numbers, exact up to 2^53 (about 900 billion USD).
export type Sql = postgres.Sql<{ bigint: number }>;
export type Tx = postgres.TransactionSql<{ bigint: number }>;

/**
 * The pool, every awaited statement bounded (bounded.ts): a database outage is a fast
 * 503, not a hang. A connection of its own probes whether the server answers at all.
 */
export function connect(url: string, max: number): Sql {
  const pool = rawConnect(url, max);
  // The probe runs only `SELECT 1`, so it skips postgres.js's array-type fetch on
  // connect: that fetch is a promise nothing awaits, and a probe closed while it runs
  // (a pool ended within ~250 ms of the probe's first connection) rejected it unhandled.
  const probe = rawConnect(url, 1, { fetch_types: false });
  const live = new Liveness(() => probe`SELECT 1`);
  const end = pool.end.bind(pool);
  // Closing the pool closes its probe too.
  (pool as { end: Sql['end'] }).end = async (opts) => {
    live.stop();
    await probe.end({ timeout: 0 });
    return end(opts);
  };
  return bounded(pool, undefined, live);
}

function rawConnect(url: string, max: number, extra: { fetch_types?: boolean } = {}): Sql {
  return postgres(url, {
    ...extra,
    max,
    onnotice: () => {},
    idle_timeout: 60,
    connect_timeout: CONNECT_TIMEOUT_S,
    types: {
      bigint: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) },
    },
  }) as unknown as Sql;
}
