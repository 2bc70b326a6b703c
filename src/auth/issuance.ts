import { ApiError, conflict, notFound } from '../errors.js';
import type { Sql, Tx } from '../db/index.js';
import { newId } from '../ids.js';
import { generateKey, hashKey, keyPrefix } from './keys.js';
import { ungrantable, type Principal, type RateLimits } from './principal.js';
import { iso } from '../format.js';

// Users, teams, memberships and keys. Every user and team gets its wallet in
// the same transaction that creates it, so no owner is ever without one.

const isUniqueViolation = (e: unknown) => (e as { code?: string }).code === '23505';

export async function createUser(sql: Sql, name: string, email: string) {
  try {
    return await sql.begin(async (tx) => {
      const id = newId();
      const [u] = await tx<{ created_at: Date }[]>`INSERT INTO users (id, name, email) VALUES (${id}, ${name}, ${email}) RETURNING created_at`;
      const walletId = await createWallet(tx, { userId: id });
      return { id, name, email, createdAt: iso(u!.created_at), walletId };
    });
  } catch (e) {
    if (isUniqueViolation(e)) throw conflict(`a user with email ${JSON.stringify(email)} already exists`, 'email');
    throw e;
  }
}

export async function createWallet(tx: Tx, owner: { userId?: string; teamId?: string }): Promise<string> {
  const id = newId();
  await tx`INSERT INTO wallets (id, user_id, team_id) VALUES (${id}, ${owner.userId ?? null}, ${owner.teamId ?? null})`;
  return id;
}

function slugify(name: string): string {
  const s = name.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '').slice(0, 48);
  return s || 'team';
}

export async function createTeam(sql: Sql, name: string, slug: string | null | undefined, email: string | null | undefined) {
  const explicit = !!slug;
  const base = slug || slugify(name);
  for (let attempt = 0; attempt < 5; attempt++) {
    const candidate = attempt === 0 ? base : `${base}-${newId().slice(0, 6)}`;
    try {
      return await sql.begin(async (tx) => {
        const id = newId();
        const [t] = await tx<{ created_at: Date }[]>`
          INSERT INTO teams (id, name, slug, email) VALUES (${id}, ${name}, ${candidate}, ${email ?? null}) RETURNING created_at`;
        const walletId = await createWallet(tx, { teamId: id });
        return { id, name, slug: candidate, email: email ?? null, hasBetaAccess: false, createdAt: iso(t!.created_at), walletId };
      });
    } catch (e) {
      if (!isUniqueViolation(e)) throw e;
      if (explicit) throw conflict(`a team with slug ${JSON.stringify(candidate)} already exists`, 'slug');
    }
  }
  throw conflict('could not find a free slug for this team name; give one explicitly', 'slug');
}

export async function addMember(sql: Sql, teamId: string, userId: string, role: 'ADMIN' | 'MEMBER') {
  const [team] = await sql`SELECT 1 FROM teams WHERE id = ${teamId}`;
  if (!team) throw notFound('team', teamId);
  const [user] = await sql`SELECT 1 FROM users WHERE id = ${userId}`;
  if (!user) throw new ApiError('not_found', `user ${JSON.stringify(userId)} not found`, { param: 'userId' });
  const [row] = await sql<{ joined_at: Date; role: string }[]>`
    INSERT INTO team_members (team_id, user_id, role) VALUES (${teamId}, ${userId}, ${role})
    ON CONFLICT (team_id, user_id) DO UPDATE SET role = EXCLUDED.role
    RETURNING joined_at, role`;
  return { teamId, userId, role: row!.role, joinedAt: iso(row!.joined_at) };
}

export async function createApiKey(
  sql: Sql,
  userId: string,
  permissions: string[],
  name: string | null | undefined,
  rateLimits: { requestsPerMinute?: number | null; tokensPerMinute?: number | null } | null | undefined,
) {
  const [user] = await sql`SELECT 1 FROM users WHERE id = ${userId}`;
  if (!user) throw new ApiError('not_found', `user ${JSON.stringify(userId)} not found`, { param: 'userId' });
  const secret = generateKey();
  const id = newId();
  const limits = rateLimits ? stripNulls({ ...rateLimits }) : null;
  const [row] = await sql<{ created_at: Date }[]>`
    INSERT INTO api_keys (id, user_id, name, key_hash, key_prefix, permissions, rate_limits)
    VALUES (${id}, ${userId}, ${name ?? null}, ${hashKey(secret)}, ${keyPrefix(secret)}, ${permissions}, ${limits ? sql.json(limits as never) : null})
    RETURNING created_at`;
  // The secret is returned here once and never stored.
  return { id, key: secret, userId, name: name ?? null, permissions, rateLimits: limits, createdAt: iso(row!.created_at) };
}

/** 403 unless the caller holds every permission it hands out (see `canGrant`). */
export function assertGrantable(caller: Principal, permissions: Iterable<string>, param = 'permissions'): void {
  const denied = ungrantable(caller, permissions);
  if (denied.length > 0) {
    throw new ApiError('forbidden', `a key may grant only permissions it holds; this key does not hold ${denied.join(', ')}`, { param });
  }
}

/**
 * Sets (or, with null, clears) a key's own rate limits. The caller must hold every
 * permission of the key it changes, and only `admin:*` changes its own key's limits:
 * otherwise a narrow admin key could lift its own or a stronger key's limits.
 */
export async function setKeyRateLimits(
  sql: Sql,
  caller: Principal,
  keyId: string,
  rateLimits: { requestsPerMinute?: number | null; tokensPerMinute?: number | null } | null,
) {
  const limits = rateLimits ? stripNulls({ ...rateLimits }) : null;
  return sql.begin(async (tx) => {
    const [key] = await tx<{ permissions: string[] }[]>`SELECT permissions FROM api_keys WHERE id = ${keyId} FOR UPDATE`;
    if (!key) throw notFound('API key', keyId);
    assertGrantable(caller, key.permissions, 'keyId');
    if (keyId === caller.keyId && !caller.permissions.has('admin:*')) {
      throw new ApiError('forbidden', "a key may not change its own rate limits (only admin:* may)", { param: 'keyId' });
    }
    const [row] = await tx<{ id: string; user_id: string }[]>`
      UPDATE api_keys SET rate_limits = ${limits ? tx.json(limits as never) : null} WHERE id = ${keyId} RETURNING id, user_id`;
    return { id: row!.id, userId: row!.user_id, rateLimits: limits };
  });
}

/**
 * Revokes a key: the row stays, with its revocation time, so ledger rows and logs that
 * name it still resolve. The caller must hold every permission of the key (the rule of
 * `setKeyRateLimits`). Revoking a revoked key answers it again, unchanged (idempotent,
 * as a DELETE is). Every replica refuses it within a notification's delay (migration 002).
 */
export async function revokeApiKey(sql: Sql, caller: Principal, keyId: string) {
  return sql.begin(async (tx) => {
    const [key] = await tx<{ permissions: string[] }[]>`SELECT permissions FROM api_keys WHERE id = ${keyId} FOR UPDATE`;
    if (!key) throw notFound('API key', keyId);
    assertGrantable(caller, key.permissions, 'keyId');
    const [row] = await tx<KeyRow[]>`
      UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = ${keyId}
      RETURNING ${tx.unsafe(KEY_COLUMNS)}`;
    return keyView(row!);
  });
}

/** A user's keys, newest first, without secrets or hashes (the prefix identifies a key to its owner). */
export async function listApiKeys(sql: Sql, userId: string) {
  const [u] = await sql`SELECT 1 FROM users WHERE id = ${userId}`;
  if (!u) throw notFound('user', userId);
  const rows = await sql<KeyRow[]>`
    SELECT ${sql.unsafe(KEY_COLUMNS)} FROM api_keys WHERE user_id = ${userId} ORDER BY created_at DESC, id DESC`;
  return rows.map(keyView);
}

const KEY_COLUMNS = 'id, user_id, name, key_prefix, permissions, rate_limits, created_at, revoked_at';
interface KeyRow {
  id: string;
  user_id: string;
  name: string | null;
  key_prefix: string;
  permissions: string[];
  rate_limits: RateLimits | null;
  created_at: Date;
  revoked_at: Date | null;
}
function keyView(r: KeyRow) {
  return {
    id: r.id,
    userId: r.user_id,
    name: r.name,
    prefix: r.key_prefix,
    permissions: r.permissions,
    rateLimits: r.rate_limits,
    createdAt: r.created_at.toISOString(),
    revokedAt: r.revoked_at ? r.revoked_at.toISOString() : null,
  };
}

function stripNulls(o: { [k: string]: number | null | undefined }): RateLimits {
  const r: Record<string, number> = {};
  for (const [k, v] of Object.entries(o)) if (v !== null && v !== undefined) r[k] = v;
  return r;
}

export const BOOTSTRAP_ADMIN_USER = 'admin';
const BOOTSTRAP_ADMIN_KEY_ID = 'bootstrap-admin';

/** Makes ADMIN_API_KEY a live `admin:*` key (or revokes the old one when it is unset). */
export async function bootstrapAdmin(sql: Sql, secret: string | undefined): Promise<void> {
  await sql.begin(async (tx) => {
    if (!secret) {
      await tx`UPDATE api_keys SET revoked_at = now() WHERE id = ${BOOTSTRAP_ADMIN_KEY_ID} AND revoked_at IS NULL`;
      return;
    }
    const [u] = await tx`SELECT 1 FROM users WHERE id = ${BOOTSTRAP_ADMIN_USER}`;
    if (!u) {
      await tx`INSERT INTO users (id, name, email) VALUES (${BOOTSTRAP_ADMIN_USER}, 'Administrator', 'admin@cloudgate.local')`;
      await createWallet(tx, { userId: BOOTSTRAP_ADMIN_USER });
    }
    await tx`
      INSERT INTO api_keys (id, user_id, name, key_hash, key_prefix, permissions)
      VALUES (${BOOTSTRAP_ADMIN_KEY_ID}, ${BOOTSTRAP_ADMIN_USER}, 'ADMIN_API_KEY', ${hashKey(secret)}, ${keyPrefix(secret)}, ${['admin:*']})
      ON CONFLICT (id) DO UPDATE SET key_hash = EXCLUDED.key_hash, key_prefix = EXCLUDED.key_prefix, revoked_at = NULL`;
  });
}
