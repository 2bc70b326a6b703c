import postgres from 'postgres';

// One pool per process. bigint (int8) columns hold money in USD x 10000 and
// counts; they are parsed to JS numbers, exact up to 2^53 (about 900 billion USD).
export type Sql = postgres.Sql<{ bigint: number }>;
export type Tx = postgres.TransactionSql<{ bigint: number }>;

export function connect(url: string, max: number): Sql {
  return postgres(url, {
    max,
    onnotice: () => {},
    idle_timeout: 60,
    connect_timeout: 10,
    types: {
      bigint: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) },
    },
  }) as unknown as Sql;
}
