import { describe, expect, it } from 'vitest';
import http from 'node:http';
import { addMember, call, daemon, newTeam, newUser } from './helpers.js';
import { get, post } from './platform-helpers.js';

const W = ['evaluations:write'];

/** Sends headers declaring `length` bytes and a few of them, then reads the answer. */
function declaredOnly(path: string, key: string, length: number): Promise<{ status: number; body: string }> {
  const url = new URL(daemon().platformUrl + path);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': length } },
      (res) => {
        let body = '';
        res.on('data', (c) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode!, body }));
      },
    );
    req.on('error', reject);
    req.write('{"samples":[');
  });
}

async function record(key: string, extra: Record<string, unknown> = {}) {
  const r = await post(key, '/api/v1/evaluations/', { name: 'gsm8k run', model_name: 'm', environments: [{ id: 'gsm8k' }], tags: ['a'], metadata: { k: 1 }, ...extra });
  expect(r.status).toBe(201);
  return r.body;
}

describe('evaluation records', () => {
  it('creates a PENDING record with the client\'s fields and reads it back', async () => {
    const u = await newUser(W);
    const e = await record(u.key, { run_id: 'run-1', description: null, dataset: null });
    expect(e).toMatchObject({ name: 'gsm8k run', status: 'PENDING', eval_type: 'training', model_name: 'm', run_id: 'run-1', tags: ['a'], metadata: { k: 1 }, total_samples: 0, environment_ids: ['gsm8k'], dataset: null, finalized_at: null });
    expect(e.evaluation_id).toBe(e.id);
    const r = await get(u.key, `/api/v1/evaluations/${e.id}`);
    expect(r.body).toEqual(e);
    for (const b of [{}, { name: '' }, { name: 'x', tags: 'a' }, { name: 'x', metadata: [1] }]) {
      const bad = await post(u.key, '/api/v1/evaluations', b);
      expect(bad.status, JSON.stringify(b)).toBe(422);
    }
    const other = await newUser(W);
    expect((await get(other.key, `/api/v1/evaluations/${e.id}`)).status).toBe(404);
  });

  it('adds up repeated and concurrent pushes, pages samples in push order, and refuses a push after finalize', async () => {
    const u = await newUser(W);
    const e = await record(u.key);
    const push = (samples: unknown[]) => post(u.key, `/api/v1/evaluations/${e.id}/samples`, { samples });
    const first = await push([{ i: 0 }, { i: 1 }]);
    expect(first.status).toBe(200);
    expect(first.body).toEqual({ evaluation_id: e.id, samples_pushed: 2, status: 'PENDING' });
    // Four batches at a time, as the client uploads.
    const batches = await Promise.all([0, 1, 2, 3].map((b) => push(Array.from({ length: 5 }, (_, j) => ({ batch: b, j })))));
    expect(batches.map((b) => b.body.samples_pushed)).toEqual([5, 5, 5, 5]);
    expect((await push([])).body.samples_pushed).toBe(0);
    expect((await get(u.key, `/api/v1/evaluations/${e.id}`)).body.total_samples).toBe(22);
    const page1 = await get(u.key, `/api/v1/evaluations/${e.id}/samples?page=1&limit=2`);
    expect(page1.body).toMatchObject({ samples: [{ i: 0 }, { i: 1 }], total: 22, page: 1, limit: 2 });
    const all = await get(u.key, `/api/v1/evaluations/${e.id}/samples?limit=100`);
    expect(all.body.samples).toHaveLength(22);
    for (const b of [0, 1, 2, 3]) expect(all.body.samples.filter((s: any) => s.batch === b).map((s: any) => s.j)).toEqual([0, 1, 2, 3, 4]);
    expect((await get(u.key, `/api/v1/evaluations/${e.id}/samples?page=12&limit=2`)).body.samples).toEqual([]);
    expect((await get(u.key, `/api/v1/evaluations/${e.id}/samples?limit=1001`)).status).toBe(422);

    const fin = await post(u.key, `/api/v1/evaluations/${e.id}/finalize`, { metrics: { accuracy: 0.5 } });
    expect(fin.status).toBe(200);
    expect(fin.body).toMatchObject({ status: 'COMPLETED', metrics: { accuracy: 0.5 }, total_samples: 22 });
    expect(typeof fin.body.finalized_at).toBe('string');
    const late = await push([{ i: 99 }]);
    expect(late.status).toBe(409);
    expect(late.body.errors[0].details).toContain('COMPLETED');
    expect((await post(u.key, `/api/v1/evaluations/${e.id}/finalize`, {})).status).toBe(409);
    expect((await get(u.key, `/api/v1/evaluations/${e.id}`)).body.total_samples).toBe(22);
  });

  it('validates sample batches: objects only, and text PostgreSQL cannot store is a 422, not a 500', async () => {
    const u = await newUser(W);
    const e = await record(u.key);
    const path = `/api/v1/evaluations/${e.id}/samples`;
    const bad = await post(u.key, path, { samples: [{ ok: 1 }, 'text'] });
    expect(bad.status).toBe(422);
    expect(bad.body.errors[0].param).toBe('samples.1');
    expect((await post(u.key, path, {})).body.errors[0].param).toBe('samples');
    const nul = await post(u.key, path, { samples: [{ text: 'a\u0000b' }] });
    expect(nul.status).toBe(422);
    expect((await get(u.key, `/api/v1/evaluations/${e.id}`)).body.total_samples).toBe(0);
    const stranger = await newUser(W);
    expect((await post(stranger.key, path, { samples: [{}] })).status).toBe(404);
    const reader = await newUser(['evaluations:read']);
    expect((await post(reader.key, path, { samples: [{}] })).status).toBe(403);
    expect((await post(u.key, '/api/v1/evaluations/nope/samples', { samples: [{}] })).status).toBe(404);
  });

  it('admits the 25 MiB batches real clients send and refuses a body over the limit with 413', async () => {
    const u = await newUser(W);
    const e = await record(u.key);
    const filler = 'x'.repeat(10_000);
    const samples = Array.from({ length: 2600 }, (_, i) => ({ i, completion: filler }));
    const raw = JSON.stringify({ samples });
    expect(raw.length).toBeGreaterThan(25 * 1024 * 1024 * 0.98);
    expect(raw.length).toBeLessThanOrEqual(26 * 1024 * 1024);
    const r = await call('platform', 'POST', `/api/v1/evaluations/${e.id}/samples`, { key: u.key, raw, headers: { 'content-type': 'application/json' } });
    expect(r.status).toBe(200);
    expect(r.body.samples_pushed).toBe(2600);
    const last = await get(u.key, `/api/v1/evaluations/${e.id}/samples?page=2600&limit=1`);
    expect(last.body.samples[0].i).toBe(2599);
    // Declared over the 32 MiB limit: refused before the body is read (a client would otherwise stream it all).
    const over = await declaredOnly(`/api/v1/evaluations/${e.id}/samples`, u.key, 32 * 1024 * 1024 + 1);
    expect(over.status).toBe(413);
    expect(over.body).toContain('33554432');
  }, 60_000);

  it('lists the caller\'s records (skip/limit) or a team\'s to its members', async () => {
    const u = await newUser(W);
    const mate = await newUser(W);
    const team = await newTeam();
    await addMember(team.id, u.userId);
    await addMember(team.id, mate.userId);
    const a = await record(u.key);
    const b = await record(u.key, { team_id: team.id });
    const r = await get(u.key, '/api/v1/evaluations?skip=0&limit=50');
    expect(r.body).toMatchObject({ total: 2, skip: 0, limit: 50 });
    expect(r.body.evaluations.map((x: any) => x.id)).toEqual([b.id, a.id]);
    expect((await get(u.key, '/api/v1/evaluations?skip=1&limit=1')).body.evaluations.map((x: any) => x.id)).toEqual([a.id]);
    const t = await get(mate.key, `/api/v1/evaluations?team_id=${team.id}`);
    expect(t.body.evaluations.map((x: any) => x.id)).toEqual([b.id]);
    // Team records are readable and writable by members.
    expect((await post(mate.key, `/api/v1/evaluations/${b.id}/samples`, { samples: [{ by: 'mate' }] })).status).toBe(200);
    const outsider = await newUser(W);
    expect((await get(outsider.key, `/api/v1/evaluations?team_id=${team.id}`)).status).toBe(404);
    expect((await post(outsider.key, '/api/v1/evaluations', { name: 'x', team_id: team.id })).status).toBe(403);
  });
});
