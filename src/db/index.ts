import postgres from 'postgres';
import { bounded } from './bounded.js';

/** Seconds to establish a connection: a stalled server must not hold the pool (see bounded.ts). */
const CONNECT_TIMEOUT_S = 2;

// One pool per process. bigint (int8) columns hold money in USD x 10000 and
// counts; they are parsed to JS numbers, exact up to 2^53 (about 900 billion USD).
export type Sql = postgres.Sql<{ bigint: number }>;
export type Tx = postgres.TransactionSql<{ bigint: number }>;

/** The pool, every awaited statement bounded (bounded.ts): a database outage is a fast 503, not a hang. */
export function connect(url: string, max: number): Sql {
  return bounded(rawConnect(url, max));
}

function rawConnect(url: string, max: number): Sql {
  return postgres(url, {
    max,
    onnotice: () => {},
    idle_timeout: 60,
    connect_timeout: CONNECT_TIMEOUT_S,
    types: {
      bigint: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) },
    },
  }) as unknown as Sql;
}
