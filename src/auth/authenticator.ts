import { timingSafeEqual } from 'node:crypto';
import { ApiError } from '../errors.js';
import type { Sql } from '../db/index.js';
import { hashKeyB64 } from './keys.js';
import type { Principal, RateLimits } from './principal.js';

interface Cached {
  principal: Principal | null;
  expiresAt: number;
}

// Cache entries are bounded so a flood of random keys cannot grow memory.
const CACHE_ENTRIES_MAX = 10_000;

/**
 * Resolves `Authorization: Bearer <key>` to a principal. Results (misses too)
 * are cached for `ttlMs`, so a hot route costs one hash and a map lookup.
 */
export class Authenticator {
  private readonly cache = new Map<string, Cached>();
  constructor(
    private readonly sql: Sql,
    private readonly ttlMs: number,
  ) {}

  async authenticate(header: string | undefined): Promise<Principal> {
    const m = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!m) throw new ApiError('unauthenticated', 'missing or malformed Authorization header; expected "Bearer <API_KEY>"', { param: 'authorization' });
    const secret = m[1]!;
    const cacheKey = hashKeyB64(secret);
    const now = Date.now();
    let hit = this.cache.get(cacheKey);
    if (!hit || hit.expiresAt < now) {
      hit = { principal: await this.lookup(Buffer.from(cacheKey, 'base64')), expiresAt: now + this.ttlMs };
      if (this.ttlMs > 0) {
        if (this.cache.size >= CACHE_ENTRIES_MAX) this.cache.delete(this.cache.keys().next().value!);
        this.cache.set(cacheKey, hit);
      }
    }
    if (!hit.principal) throw new ApiError('unauthenticated', 'invalid API key', { param: 'authorization' });
    return hit.principal;
  }

  /** Drop cached results, e.g. after a key's limits change. */
  invalidate(): void {
    this.cache.clear();
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
