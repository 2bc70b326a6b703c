import { afterAll, describe, expect, it } from 'vitest';
import { addMember, admin, call, newTeam, newUser } from './helpers.js';
import { closeDb, database, fund, get, place, post, uniq, until } from './platform-helpers.js';

afterAll(closeDb);

const as = (key: string, method: string, path: string, body?: unknown) => call('platform', method, path, { key, body });

/** A funded user's ACTIVE disk, attached to a pod of theirs. */
async function attachedDisk() {
  const u = await newUser(['disks:write', 'instances:write']);
  await fund(u.walletId);
  const p = await place();
  const d = (await post(u.key, '/api/v1/disks', { disk: { size: 20, dataCenterId: p.dc }, provider: { type: p.provider } })).body;
  await until(() => get(u.key, `/api/v1/disks/${d.id}`), (r) => r.body.status === 'ACTIVE');
  const pod = (await post(u.key, '/api/v1/pods', { ...p.body(), disks: [d.id] })).body;
  return { u, d, pod };
}

describe('admin disks', () => {
  it('force-terminates an orphaned disk (even one still attached), keeps the row, and needs admin:disks', async () => {
    const { u, d, pod } = await attachedDisk();
    const [disksAdmin, usersAdmin, plain] = await Promise.all([newUser(['admin:disks']), newUser(['admin:users']), newUser(['disks:write'])]);
    expect((await as(usersAdmin.key, 'DELETE', `/api/admin/disks/${d.id}/force`)).status).toBe(403);
    expect((await as(plain.key, 'DELETE', `/api/admin/disks/${d.id}/force`)).status).toBe(403);
    expect((await call('platform', 'DELETE', `/api/admin/disks/${d.id}/force`, { key: null })).status).toBe(401);
    const r = await as(disksAdmin.key, 'DELETE', `/api/admin/disks/${d.id}/force`);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toEqual({ data: { id: d.id, status: 'TERMINATED' }, status: 'success' });
    const kept = await get(u.key, `/api/v1/disks/${d.id}`);
    expect(kept.body).toMatchObject({ status: 'TERMINATED', pods: [] });
    const podNow = await get(u.key, `/api/v1/pods/${pod.id}`);
    expect(podNow.body.attachedResources.map((a: any) => a.id)).toEqual(['ephemeral']);
    expect((await admin('DELETE', `/api/admin/disks/${d.id}/force`)).status).toBe(409);
    expect((await admin('DELETE', '/api/admin/disks/no-such-disk/force')).status).toBe(404);
  });
});

describe('admin disks under a concurrent pod update', () => {
  // CI once saw this route answer 500: it locked the attachment row, then the
  // pod, while the reconciler polling that pod locks the pod, then the
  // attachment, and PostgreSQL broke the deadlock by failing one of them.
  it('waits for a transaction holding the pod (as the reconciler does) instead of deadlocking with it', async () => {
    const { u, d, pod } = await attachedDisk();
    const sql = database();
    let force: Promise<{ status: number; body: any }> | undefined;
    await sql.begin(async (tx) => {
      await tx`UPDATE pods SET updated_at = now() WHERE id = ${pod.id}`;
      const [{ me }] = await tx<{ me: number }[]>`SELECT pg_backend_pid() AS me`;
      force = admin('DELETE', `/api/admin/disks/${d.id}/force`);
      // Go on once the route waits on a lock this transaction holds.
      const blocked = await until(
        () => sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE ${me}::int = ANY(pg_blocking_pids(pid))`,
        (rows) => rows[0]!.n > 0,
      );
      expect(blocked[0]!.n).toBe(1);
      await tx`UPDATE pod_disks SET status = status WHERE pod_id = ${pod.id} AND disk_id = ${d.id}`;
    });
    const r = await force!;
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect((await get(u.key, `/api/v1/disks/${d.id}`)).body).toMatchObject({ status: 'TERMINATED', pods: [] });
  });
});

describe('admin user teams', () => {
  it('lists a user\'s teams: admin:* reads all, admin:users only teams its own user belongs to', async () => {
    const target = await newUser(['teams:read']);
    const [t1, t2] = [await newTeam(), await newTeam()];
    await addMember(t1.id, target.userId);
    await addMember(t2.id, target.userId);
    const all = await admin('GET', `/api/admin/users/${target.userId}/teams`);
    expect(all.status).toBe(200);
    expect(all.body.status).toBe('success');
    expect(all.body.data.map((t: any) => t.id)).toEqual([t1.id, t2.id]);
    expect(all.body.data[0]).toEqual({ id: t1.id, name: t1.name, createdAt: expect.any(String), slug: t1.slug, email: null, hasBetaAccess: false });
    const scoped = await newUser(['admin:users']);
    expect((await as(scoped.key, 'GET', `/api/admin/users/${target.userId}/teams`)).body.data).toEqual([]);
    await addMember(t2.id, scoped.userId);
    expect((await as(scoped.key, 'GET', `/api/admin/users/${target.userId}/teams`)).body.data.map((t: any) => t.id)).toEqual([t2.id]);
    expect((await as(target.key, 'GET', `/api/admin/users/${target.userId}/teams`)).status).toBe(403);
    expect((await admin('GET', '/api/admin/users/no-such-user/teams')).status).toBe(404);
  });
});

/** A contract with three nodes, a cluster, and live assignments of each node. */
async function inventory() {
  const u = uniq();
  const ids = {
    provider: `iprov-${u}`,
    dc: `IDC-${u}`,
    contract: `icontract-${u}`,
    cluster: `icluster-${u}`,
    nodes: [0, 1, 2].map((i) => `inode-${u}-${i}`),
    assignments: [0, 1, 2].map((i) => `iassign-${u}-${i}`),
    gpuType: `IGPU_${u.toUpperCase()}`,
  };
  const r = await admin('POST', '/api/admin/inventory/import', {
    providers: [{ id: ids.provider, name: 'P', maxDisksPerPod: 1 }],
    dataCenters: [{ id: ids.dc, providerId: ids.provider, name: 'D', region: `r_${u}`, country: 'FR' }],
    contracts: [{ id: ids.contract, providerId: ids.provider, name: `Contract ${u}` }],
    nodes: ids.nodes.map((id) => ({ id, dataCenterId: ids.dc, contractId: ids.contract, gpuType: ids.gpuType, gpuCount: 8, gpuMemory: 80, socket: 'SXM', vcpus: 128, memory: 1024, disk: 8000 })),
    clusters: [{ id: ids.cluster, name: 'C', dataCenterId: ids.dc }],
    assignments: ids.assignments.map((id, i) => ({ id, nodeId: ids.nodes[i], clusterId: ids.cluster, status: i === 2 ? 'PENDING' : 'ACTIVE' })),
    gpuOffers: [
      {
        id: `ioffer-${u}`,
        dataCenterId: ids.dc,
        cloudId: `icloud-${u}`,
        gpuType: ids.gpuType,
        gpuCount: 8,
        gpuMemory: 80,
        socket: 'SXM',
        security: 'secure_cloud',
        disk: { defaultCount: 100 },
        vcpu: { defaultCount: 64 },
        memory: { defaultCount: 512 },
        onDemand: 10,
        images: ['i'],
      },
    ],
  });
  expect(r.status).toBe(200);
  expect(r.body.data).toMatchObject({ created: 11, updated: 0 });
  return ids;
}

describe('admin inventory', () => {
  it('detaches contract nodes: assignments end and stay as history, the nodes stop being rented out', async () => {
    const inv = await inventory();
    const user = await newUser(['availability:read']);
    const offer = () => get(user.key, `/api/v1/availability/gpus?data_center_id=${inv.dc}`);
    expect((await offer()).body.items[0].stockStatus).toBe('Available'); // 3 nodes fit one 8-GPU pod each
    const path = `/api/admin/inventory/contracts/${inv.contract}/nodes/detach`;
    const dry = await admin('POST', `${path}?dry_run=true`, { nodeIds: inv.nodes.slice(0, 2) });
    expect(dry.body.data).toMatchObject({ detached: 2, updated: 2, dryRun: true });
    expect((await offer()).body.items[0].stockStatus).toBe('Available');
    const r = await admin('POST', `${path}?reason=decommission`, { nodeIds: [...inv.nodes.slice(0, 2), 'not-in-contract'] });
    expect(r.status).toBe(200);
    expect(r.body.status).toBe('success');
    expect(r.body.data).toMatchObject({
      operationId: expect.any(String),
      message: expect.stringContaining('detached 2 nodes'),
      targetId: inv.contract,
      targetName: expect.stringContaining('Contract'),
      created: 0,
      updated: 2,
      assigned: 0,
      detached: 2,
      retired: 0,
      notInContract: ['not-in-contract'],
    });
    const hist = await admin('GET', `/api/admin/inventory/assignments?cluster_id=${inv.cluster}`);
    expect(hist.body.data.map((a: any) => [a.id, a.status, a.endedAt !== null])).toEqual([
      [inv.assignments[0], 'ENDED', true],
      [inv.assignments[1], 'ENDED', true],
      [inv.assignments[2], 'PENDING', false],
    ]);
    expect((await offer()).body.items[0].stockStatus).toBe('Low'); // one node left under contract
    const audit = await admin('GET', `/api/admin/inventory/audit?operation_id=${r.body.data.operationId}`);
    expect(audit.body.data[0]).toMatchObject({ action: 'contract.nodes.detach', targetId: inv.contract, detail: { reason: 'decommission', nodeIds: inv.nodes.slice(0, 2) } });
    // Detaching again finds nothing left in the contract.
    expect((await admin('POST', path, { nodeIds: inv.nodes.slice(0, 2) })).body.data.detached).toBe(0);
  });

  it('bounds nodeIds and assignmentIds at 1000, checks the contract and the scope', async () => {
    const inv = await inventory();
    const path = `/api/admin/inventory/contracts/${inv.contract}/nodes/detach`;
    const ids = (n: number) => Array.from({ length: n }, (_, i) => `x-${i}`);
    expect((await admin('POST', path, { nodeIds: ids(1000) })).status).toBe(200);
    const over = await admin('POST', path, { nodeIds: ids(1001) });
    expect(over.status).toBe(422);
    expect(over.body.errors[0].param).toBe('nodeIds');
    expect((await admin('POST', path, { nodeIds: [] })).status).toBe(422);
    expect((await admin('POST', '/api/admin/inventory/contracts/nope/nodes/detach', { nodeIds: ['a'] })).status).toBe(404);
    expect((await admin('POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: ids(1000) })).status).toBe(200);
    const over2 = await admin('POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: ids(1001) });
    expect(over2.status).toBe(422);
    expect(over2.body.errors[0].param).toBe('assignmentIds');
    const wrong = await newUser(['admin:disks']);
    expect((await as(wrong.key, 'POST', path, { nodeIds: ['a'] })).status).toBe(403);
    expect((await as(wrong.key, 'POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: ['a'] })).status).toBe(403);
    const scoped = await newUser(['admin:inventory']);
    expect((await as(scoped.key, 'POST', path, { nodeIds: ['a'] })).status).toBe(200);
  });

  it('bulk-deletes assignment rows outright, leaves nodes and clusters, and snapshots them in the audit entry', async () => {
    const inv = await inventory();
    const r = await admin('POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: [inv.assignments[0], inv.assignments[1], 'unknown-id'], expectedStatuses: null });
    expect(r.status).toBe(200);
    expect(r.body.status).toBe('partial');
    expect(r.body.data).toMatchObject({ deleted: 2, refused: [], notFound: ['unknown-id'] });
    const left = await admin('GET', `/api/admin/inventory/assignments?cluster_id=${inv.cluster}`);
    expect(left.body.data.map((a: any) => a.id)).toEqual([inv.assignments[2]]);
    const user = await newUser(['availability:read']);
    expect((await get(user.key, `/api/v1/availability/gpus?data_center_id=${inv.dc}`)).body.totalCount).toBe(1);
    const audit = await admin('GET', `/api/admin/inventory/audit?operation_id=${r.body.data.operationId}`);
    expect(audit.body.data[0].action).toBe('assignments.bulk_delete');
    expect(audit.body.data[0].detail.deleted.map((a: any) => [a.id, a.nodeId, a.clusterId, a.status])).toEqual([
      [inv.assignments[0], inv.nodes[0], inv.cluster, 'ACTIVE'],
      [inv.assignments[1], inv.nodes[1], inv.cluster, 'ACTIVE'],
    ]);
    const all = await admin('POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: [inv.assignments[2]] });
    expect(all.body.status).toBe('success');
  });

  it('with expectedStatuses, refuses and names a row whose status changed, and deletes the rest', async () => {
    const inv = await inventory();
    // The caller read assignment 2 as PENDING; it has since gone live.
    expect((await admin('PATCH', `/api/admin/inventory/assignments/${inv.assignments[2]}`, { status: 'ACTIVE' })).status).toBe(200);
    const r = await admin('POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: [inv.assignments[2]], expectedStatuses: ['PENDING'] });
    expect(r.status).toBe(200);
    expect(r.body.status).toBe('partial');
    expect(r.body.data).toMatchObject({ deleted: 0, refused: [{ id: inv.assignments[2], status: 'ACTIVE' }] });
    expect(r.body.data.message).toContain('refused');
    const still = await admin('GET', `/api/admin/inventory/assignments?ids=${inv.assignments[2]}`);
    expect(still.body.data[0].status).toBe('ACTIVE');
    const ok = await admin('POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: inv.assignments, expectedStatuses: ['ACTIVE'] });
    expect(ok.body).toMatchObject({ status: 'success', data: { deleted: 3 } });
    expect((await admin('PATCH', '/api/admin/inventory/assignments/nope', { status: 'ACTIVE' })).status).toBe(404);
    expect((await admin('PATCH', `/api/admin/inventory/assignments/${inv.assignments[0]}`, { status: 'LIVE' })).status).toBe(422);
  });

  it('never deletes a row that went live under a concurrent status change', async () => {
    const inv = await inventory();
    const ids = Array.from({ length: 20 }, (_, i) => `race-${inv.cluster}-${i}`);
    const imp = await admin('POST', '/api/admin/inventory/import', { assignments: ids.map((id) => ({ id, nodeId: inv.nodes[0], clusterId: inv.cluster, status: 'PENDING' })) });
    expect(imp.status).toBe(200);
    const outcomes = await Promise.all(
      ids.map(async (id) => {
        const [patch, bulk] = await Promise.all([
          admin('PATCH', `/api/admin/inventory/assignments/${id}`, { status: 'ACTIVE' }),
          admin('POST', '/api/admin/inventory/assignments/bulk-delete', { assignmentIds: [id], expectedStatuses: ['PENDING'] }),
        ]);
        const row = (await admin('GET', `/api/admin/inventory/assignments?ids=${id}`)).body.data[0];
        return { patch: patch.status, deleted: bulk.body.data.deleted, refused: bulk.body.data.refused.length, row: row?.status ?? null };
      }),
    );
    for (const o of outcomes) {
      // Either the delete came first (the change finds no row) or the change did (the delete refuses it).
      const deletedFirst = o.patch === 404 && o.deleted === 1 && o.row === null;
      const changedFirst = o.patch === 200 && o.deleted === 0 && o.refused === 1 && o.row === 'ACTIVE';
      expect(deletedFirst || changedFirst, JSON.stringify(o)).toBe(true);
    }
  });

  it('imports inventory with validation: unknown references are 422, the import is audited', async () => {
    const bad = await admin('POST', '/api/admin/inventory/import', { nodes: [{ id: `n-${uniq()}`, dataCenterId: 'no-such-dc', gpuType: 'X', gpuCount: 1, gpuMemory: 1, socket: 'PCIe', vcpus: 1, memory: 1, disk: 1 }] });
    expect(bad.status).toBe(422);
    const shape = await admin('POST', '/api/admin/inventory/import', { nodes: [{ id: 'x' }] });
    expect(shape.status).toBe(422);
    expect(shape.body.errors[0].param).toMatch(/^nodes\.0\./);
    const scoped = await newUser(['admin:users']);
    expect((await as(scoped.key, 'POST', '/api/admin/inventory/import', {})).status).toBe(403);
  });
});
