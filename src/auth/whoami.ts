import type { Sql } from '../db/index.js';
import { notFound } from '../errors.js';
import { can, PERMISSIONS, type Principal } from './principal.js';

// GET /api/v1/user/whoami, in the shape Prime's CLI reads (prime_cli/commands/whoami.py):
// `{data: {id, email, name, slug, scope: {area: {read, write}}}}`. The CLI stores
// `id` as its user id and prints one row per scope. Users here have no slug: null
// (the CLI prints "Not set"). Never the key's secret; the key's id is given so a
// user can tell which key a tool is using.

/** Permission areas in the order of PERMISSIONS; `admin` is one row (any admin scope). */
const AREAS = [...new Set(PERMISSIONS.map((p) => p.split(':')[0]!))];

export function scopeTable(p: Principal): Record<string, { read: boolean; write: boolean }> {
  const out: Record<string, { read: boolean; write: boolean }> = {};
  for (const area of AREAS) {
    if (area === 'admin') {
      const any = [...p.permissions].some((x) => x.startsWith('admin:'));
      out[area] = { read: any, write: any };
    } else if (area === 'inference') {
      // inference has one level, `use`: it reads and writes nothing else.
      out[area] = { read: can(p, 'inference:use'), write: can(p, 'inference:use') };
    } else {
      out[area] = { read: can(p, `${area}:read`), write: can(p, `${area}:write`) };
    }
  }
  return out;
}

export async function whoami(sql: Sql, p: Principal) {
  const [u] = await sql<{ id: string; name: string; email: string }[]>`SELECT id, name, email FROM users WHERE id = ${p.userId}`;
  if (!u) throw notFound('user', p.userId);
  return { data: { id: u.id, email: u.email, name: u.name, slug: null, apiKeyId: p.keyId, scope: scopeTable(p) } };
}
