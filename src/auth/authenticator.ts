import { timingSafeEqual } from 'node:crypto';
import { ApiError } from '../errors.js';
import type { Sql } from '../db/index.js';
import { TtlCache } from '../cache.js';
import { log } from '../log.js';
import { hashKeyB64 } from './keys.js';
import type { Principal, RateLimits } from './principal.js';

// Cache entries are bounded so a flood of random keys cannot grow memory.
const CACHE_ENTRIES_MAX = 10_000;
/** Channel the api_keys trigger (migration 002) notifies at every committed key change. */
export const API_KEYS_CHANNEL = 'cloudgate_api_keys';
/**
 * Longest a cached lookup is trusted while no listener is connected (start-up, a lost
 * database connection): a revocation made by another replica may be missed then, so
 * the promise "refused everywhere within 2 s" is kept by expiry instead.
 */
const UNLISTENED_TTL_MS_MAX = 1_000;

/**
 * Resolves `Authorization: Bearer <key>` to a principal. Results (misses too)
 * are cached for `ttlMs`, so a hot route costs one hash and a map lookup.
 * Every daemon on the database LISTENs for key changes and drops its cache
 * (`listen`), so a key revoked or changed through one replica is refused or
 * changed on all of them within a notification's delay (milliseconds).
 * The generation makes a lookup that raced with a change harmless: its answer
 * is not kept if a change arrived while it was being read.
 */
export class Authenticator {
  private readonly cache = new TtlCache<Principal | null>(0, CACHE_ENTRIES_MAX);
  private listening = false;
  constructor(
    private readonly sql: Sql,
    private readonly ttlMs: number,
  ) {}

  async authenticate(header: string | undefined): Promise<Principal> {
    const m = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!m) throw new ApiError('unauthenticated', 'missing or malformed Authorization header; expected "Bearer <API_KEY>"', { param: 'authorization' });
    const secret = m[1]!;
    const cacheKey = hashKeyB64(secret);
    // Without a listener another replica's revocation could be missed: trust a lookup less long.
    const ttl = this.listening ? this.ttlMs : Math.min(this.ttlMs, UNLISTENED_TTL_MS_MAX);
    // During a database outage a key valid within OUTAGE_STALE_MS_MAX still is (src/cache.ts):
    // nothing can revoke it meanwhile, revocation writes to the same database.
    const principal = await this.cache.get(cacheKey, () => this.lookup(Buffer.from(cacheKey, 'base64')), ttl);
    if (!principal) throw new ApiError('unauthenticated', 'invalid API key', { param: 'authorization' });
    return principal;
  }

  /** Drop cached results, e.g. after a key's limits change. */
  invalidate(): void {
    this.cache.clear();
  }

  /**
   * Listens for key changes committed by any daemon. The cache is dropped when the
   * listener (re)connects, since notifications may have been missed meanwhile.
   */
  async listen(): Promise<() => Promise<void>> {
    const l = await this.sql.listen(
      API_KEYS_CHANNEL,
      () => this.invalidate(),
      () => {
        this.invalidate();
        this.listening = true;
      },
    );
    return async () => {
      this.listening = false;
      await l.unlisten().catch((e: unknown) => log.warn({ err: e }, 'api keys: unlisten failed'));
    };
  }

  private async lookup(hash: Buffer): Promise<Principal | null> {
    const rows = await this.sql<
      { id: string; user_id: string; key_hash: Buffer; permissions: string[]; rate_limits: RateLimits | null }[]
    >`SELECT id, user_id, key_hash, permissions, rate_limits FROM api_keys WHERE key_hash = ${hash} AND revoked_at IS NULL`;
    const row = rows[0];
    if (!row || !timingSafeEqual(row.key_hash, hash)) return null;
    return { keyId: row.id, userId: row.user_id, permissions: new Set(row.permissions), rateLimits: row.rate_limits };
  }
}
