import { inject } from 'vitest';

// Small clients for end-to-end tests against the shared daemon.

export const daemon = () => inject('daemon');

export interface Res<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

export async function call<T = any>(
  base: 'platform' | 'inference',
  method: string,
  path: string,
  opts: { key?: string | null; body?: unknown; headers?: Record<string, string>; raw?: string | Buffer } = {},
): Promise<Res<T>> {
  const d = daemon();
  const url = (base === 'platform' ? d.platformUrl : d.inferenceUrl) + path;
  const headers: Record<string, string> = { ...opts.headers };
  const key = opts.key === undefined ? d.adminKey : opts.key;
  if (key) headers.authorization = `Bearer ${key}`;
  let body: string | Buffer | undefined = opts.raw;
  if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers['content-type'] = 'application/json';
  }
  const res = await fetch(url, { method, headers, body });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    /* not JSON (metrics) */
  }
  return { status: res.status, body: parsed as T, headers: res.headers };
}

export const admin = <T = any>(method: string, path: string, body?: unknown) => call<T>('platform', method, path, { body });

let seq = 0;
const uniq = () => `${Date.now().toString(36)}${(seq++).toString(36)}${Math.random().toString(36).slice(2, 6)}`;

/** A fresh user with an API key holding `permissions`. */
export async function newUser(permissions: string[], rateLimits?: Record<string, number>) {
  const u = await admin('POST', '/api/admin/users', { name: `user ${uniq()}`, email: `u-${uniq()}@test.local` });
  if (u.status !== 201) throw new Error(`create user: ${u.status} ${JSON.stringify(u.body)}`);
  const k = await admin('POST', '/api/admin/api-keys', { userId: u.body.data.id, permissions, rateLimits });
  if (k.status !== 201) throw new Error(`create key: ${k.status} ${JSON.stringify(k.body)}`);
  return { userId: u.body.data.id as string, walletId: u.body.data.walletId as string, key: k.body.data.key as string, keyId: k.body.data.id as string };
}

export async function newTeam(name = `team ${uniq()}`) {
  const t = await admin('POST', '/api/admin/teams', { name });
  if (t.status !== 201) throw new Error(`create team: ${t.status} ${JSON.stringify(t.body)}`);
  return t.body.data as { id: string; slug: string; walletId: string; name: string };
}

export async function addMember(teamId: string, userId: string, role: 'ADMIN' | 'MEMBER' = 'MEMBER') {
  const r = await admin('POST', `/api/admin/teams/${teamId}/members`, { userId, role });
  if (r.status !== 201) throw new Error(`add member: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.data;
}

/** Credits a user's or team's wallet through the admin top-up route (units: USD x 10000). */
export async function fund(owner: string, amount: number, kind: 'userId' | 'teamId' = 'userId') {
  const r = await admin('POST', '/api/admin/transactions/topup', { [kind]: owner, amount, type: 'TOPUP', description: 'test funds' });
  if (r.status !== 200 && r.status !== 201) throw new Error(`top-up: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.data;
}
