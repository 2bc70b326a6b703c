// Who is calling, resolved from the bearer key once per request (cached).

export interface RateLimits {
  requestsPerMinute?: number;
  tokensPerMinute?: number;
}

export interface Principal {
  keyId: string;
  userId: string;
  permissions: ReadonlySet<string>;
  rateLimits: RateLimits | null;
}

/** Areas and levels of DESIGN.md. `write` includes `read`; `admin:*` includes every admin scope. */
export const PERMISSIONS = [
  'instances:read', 'instances:write', 'availability:read', 'disks:read', 'disks:write', 'teams:read',
  'billing:read', 'evaluations:read', 'evaluations:write', 'inference:use',
  'admin:*', 'admin:wallets', 'admin:disks', 'admin:users', 'admin:invoices', 'admin:inventory',
] as const;
export type Permission = (typeof PERMISSIONS)[number];

export function can(p: Principal, needed: string): boolean {
  const perms = p.permissions;
  if (perms.has(needed)) return true;
  const [area, level] = needed.split(':');
  if (area === 'admin') return perms.has('admin:*');
  if (level === 'read') return perms.has(`${area}:write`);
  return false;
}

export const isAdmin = (p: Principal): boolean => [...p.permissions].some((x) => x.startsWith('admin:'));

/**
 * What a caller may hand to a key it issues or changes: only what it holds itself.
 * `admin:*` is the one superuser scope, so it may grant anything, `admin:*` included;
 * a narrower admin scope grants itself and what it holds, never `admin:*` or a
 * sibling scope (otherwise `admin:users` mints an `admin:*` key and tops up wallets).
 */
export function canGrant(p: Principal, permission: string): boolean {
  return p.permissions.has('admin:*') || can(p, permission);
}

/** The permissions in `wanted` that `p` may not grant (empty when all are allowed). */
export function ungrantable(p: Principal, wanted: Iterable<string>): string[] {
  return [...wanted].filter((x) => !canGrant(p, x));
}
