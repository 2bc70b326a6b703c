import { createHash } from 'node:crypto';
import type { Sql, Tx } from '../db/index.js';
import { ApiError, invalid } from '../errors.js';
import { IDEMPOTENCY_KEY_CHARS_MAX } from './protocol.js';

// Idempotency-Key: the key row is inserted in the transaction that does the
// work, before the work. A concurrent retry with the same key waits on that
// insert (unique index) and, once the first commits, finds the stored answer.
// A first attempt that fails rolls back its key, so a retry runs afresh.

/** Keys are kept this long, like Stripe's 24 hours; a retry after a day is a new request. */
export const IDEMPOTENCY_KEY_TTL_HOURS = 24;

export interface Answer {
  status: number;
  /** The JSON body, serialised once: a replay sends the same bytes. */
  json: string;
  replayed: boolean;
}

/** Validates the header value: 1 to 255 printable ASCII characters. */
export function idempotencyKey(raw: string | undefined): string | null {
  if (raw === undefined) return null;
  if (!/^[\x21-\x7e]{1,}$/.test(raw) || raw.length > IDEMPOTENCY_KEY_CHARS_MAX) {
    throw invalid('Idempotency-Key', `must be 1 to ${IDEMPOTENCY_KEY_CHARS_MAX} printable ASCII characters without spaces`, raw);
  }
  return raw;
}

export const requestHash = (normalised: unknown): string => createHash('sha256').update(JSON.stringify(normalised)).digest('hex');

/**
 * Runs `work` in a transaction, once per (scope, key): the same key with the
 * same request answers the stored response; with another request, 422.
 * Without a key, `work` simply runs in a transaction.
 */
export async function idempotent(
  sql: Sql,
  scope: string,
  key: string | null,
  hash: string,
  work: (tx: Tx) => Promise<{ status: number; body: unknown }>,
): Promise<Answer> {
  return sql.begin(async (tx) => {
    if (key !== null) {
      const [fresh] = await tx`
        INSERT INTO idempotency_keys (scope, key, request_hash) VALUES (${scope}, ${key}, ${hash})
        ON CONFLICT (scope, key) DO NOTHING RETURNING 1`;
      if (!fresh) {
        const [prior] = await tx<{ request_hash: string; response_status: number; response_body: string }[]>`
          SELECT request_hash, response_status, response_body FROM idempotency_keys WHERE scope = ${scope} AND key = ${key}`;
        if (!prior) throw new ApiError('conflict', 'Idempotency-Key: the request using this key is still in progress; retry', { param: 'Idempotency-Key' });
        if (prior.request_hash !== hash) {
          throw invalid('Idempotency-Key', 'was already used with a different request body; use a new key for a new request', key);
        }
        return { status: prior.response_status, json: prior.response_body, replayed: true };
      }
    }
    const r = await work(tx);
    const json = JSON.stringify(r.body);
    if (key !== null) {
      await tx`UPDATE idempotency_keys SET response_status = ${r.status}, response_body = ${json} WHERE scope = ${scope} AND key = ${key}`;
    }
    return { status: r.status, json, replayed: false };
  });
}

/** Forgets keys older than the TTL. */
export async function sweepIdempotencyKeys(sql: Sql): Promise<number> {
  const r = await sql`DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(hours => ${IDEMPOTENCY_KEY_TTL_HOURS})`;
  return r.count;
}
