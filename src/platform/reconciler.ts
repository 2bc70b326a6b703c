import type { Sql } from '../db/index.js';
import { log } from '../log.js';
import { openMeter } from '../money/ledger.js';
import { usd } from './common.js';
import type { PodObservation, PodSpecForProvider } from './providers/provider.js';
import type { Providers } from './providers/index.js';
import { refreshDocs } from './pod-record.js';

// Drives providers: provisions pods and disks that were ordered, polls the ones
// still changing, and applies what a poll reports (status, connection data,
// disk attachment) together with the billing change, in one transaction per
// change. Rows carry their next poll time, and the reconciler sleeps until the
// earliest of them (an order placed here wakes it at once), so an idle platform
// costs a few queries a second; state lives in the database, so a restart resumes.

/** Shortest sleep between two looks for due rows. Short enough that a scaled test offer is seen ready promptly. */
const TICK_MS = 100;
/**
 * Longest sleep when no row is due sooner: the bound on how late an order placed through
 * another replica, whose own reconciler died, is picked up here. Each look is a round trip
 * to PostgreSQL on the HTTP thread, and on a 2-core machine each one held that thread for
 * ~0.7 ms (the backend woken on its core): at a 100 ms tick, 20 of them a second delayed
 * requests arriving meanwhile (bench/README.md "The reconciler's idle queries").
 */
const IDLE_TICK_MS_MAX = 1000;
/** Rows handled per tick; the rest wait for the next one. */
const BATCH_MAX = 200;
/** A poll that fails is retried after this. */
const RETRY_MS = 1000;

interface DuePod {
  id: string;
  provider_id: string;
  provider_ref: string | null;
  node_id: string;
  data_center_id: string;
  gpu_name: string;
  gpu_count: number;
  environment_type: string;
  vcpus: number;
  memory_gb: number;
  disk_gb: number;
  provisioning_minutes: number;
  created_at: Date;
  status: string;
  disk_ids: string[];
  disk_statuses: string[];
}

const specOf = (p: DuePod): PodSpecForProvider => ({
  podId: p.id,
  dataCenterId: p.data_center_id,
  nodeId: p.node_id,
  gpuType: p.gpu_name,
  gpuCount: p.gpu_count,
  image: p.environment_type,
  vcpus: p.vcpus,
  memoryGb: p.memory_gb,
  diskGb: p.disk_gb,
  diskIds: p.disk_ids,
  provisioningMinutes: p.provisioning_minutes,
  requestedAt: p.created_at,
});

/** The reconcilers started in this process, woken by reconcileSoon(). */
const started = new Set<Reconciler>();

/** An order was placed (a pod or a disk to provision): the reconcilers of this process look now, not at their next tick. */
export function reconcileSoon(): void {
  for (const r of started) r.wake();
}

export class Reconciler {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;
  /** Woken while a tick ran: look again as soon as it ends. */
  private again = false;

  constructor(
    private readonly sql: Sql,
    private readonly providers: Providers,
  ) {}

  start(): void {
    started.add(this);
    this.schedule(TICK_MS);
  }

  private schedule(ms: number): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.run(), ms);
  }

  private run(): void {
    if (this.stopped) return;
    this.again = false;
    let nextMs = TICK_MS;
    this.running = this.tick()
      .then((ms) => void (nextMs = ms))
      .catch((e) => log.error({ err: e }, 'reconciler tick failed'))
      .finally(() => {
        this.running = undefined;
        if (!this.stopped) this.schedule(this.again ? 0 : nextMs);
      });
  }

  /** Looks for due rows now (or right after the look in progress). */
  wake(): void {
    if (this.stopped) return;
    if (this.running) this.again = true;
    else this.schedule(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    started.delete(this);
    clearTimeout(this.timer);
    await this.running;
  }

  /** Handles the due rows; answers how long to sleep before the next look. */
  async tick(): Promise<number> {
    const podsFull = await this.pods();
    const disksFull = await this.disks();
    if (podsFull || disksFull) return TICK_MS; // a full batch: more are due
    const [row] = await this.sql<{ next: Date | null }[]>`
      SELECT LEAST((SELECT min(next_poll_at) FROM pods WHERE needs_poll AND terminated_at IS NULL),
                   (SELECT min(ready_at) FROM disks WHERE status = 'PROVISIONING')) AS next`;
    const next = row?.next;
    if (!next) return IDLE_TICK_MS_MAX;
    return Math.min(IDLE_TICK_MS_MAX, Math.max(TICK_MS, next.getTime() - Date.now()));
  }

  /** Polls the pods due; answers whether it took a full batch. */
  private async pods(): Promise<boolean> {
    const due = await this.sql<DuePod[]>`
      SELECT p.id, p.provider_id, p.provider_ref, p.node_id, p.data_center_id, p.gpu_name, p.gpu_count, p.environment_type,
             p.vcpus, p.memory_gb, p.disk_gb, p.provisioning_minutes, p.created_at, p.status,
             COALESCE((SELECT array_agg(pd.disk_id ORDER BY pd.position) FROM pod_disks pd WHERE pd.pod_id = p.id AND pd.detached_at IS NULL), '{}') AS disk_ids,
             COALESCE((SELECT array_agg(pd.status ORDER BY pd.position) FROM pod_disks pd WHERE pd.pod_id = p.id AND pd.detached_at IS NULL), '{}') AS disk_statuses
      FROM pods p
      WHERE p.needs_poll AND p.terminated_at IS NULL AND p.next_poll_at <= clock_timestamp()
      ORDER BY p.next_poll_at LIMIT ${BATCH_MAX}`;
    for (const p of due) {
      try {
        const provider = await this.providers.forProvider(p.provider_id);
        const spec = specOf(p);
        const ref = p.provider_ref ?? (await provider.provision(spec));
        const now = new Date();
        const o = await provider.poll(ref, spec, now);
        const disksChanged = p.disk_ids.some((id, i) => o.disks[id] !== undefined && o.disks[id] !== p.disk_statuses[i]);
        if (o.status === p.status && !disksChanged) {
          // Nothing to apply: keep the reference and the next poll time, no transaction needed.
          await this.sql`
            UPDATE pods SET provider_ref = COALESCE(provider_ref, ${ref}), needs_poll = ${o.nextChangeAt !== null}, next_poll_at = ${o.nextChangeAt ?? now}
            WHERE id = ${p.id} AND terminated_at IS NULL`;
          continue;
        }
        await this.apply(p, ref, o, now);
      } catch (e) {
        log.warn({ err: e, podId: p.id }, 'pod poll failed; retrying');
        await this.sql`UPDATE pods SET next_poll_at = ${new Date(Date.now() + RETRY_MS)} WHERE id = ${p.id}`;
      }
    }
    return due.length === BATCH_MAX;
  }

  /**
   * Applies one observation in one transaction: the pod row (locked by the
   * update, which also checks it is still live and still in the state polled),
   * the billing change, the disk attachments and the stored record.
   */
  private async apply(p: DuePod, ref: string, o: PodObservation, now: Date): Promise<void> {
    const statusChanged = o.status !== p.status;
    const active = o.status === 'ACTIVE';
    await this.sql.begin(async (tx) => {
      const [cur] = await tx<{ wallet_id: string; price_hr_units: number; prepaid_until: Date | null }[]>`
        UPDATE pods SET provider_ref = COALESCE(provider_ref, ${ref}), needs_poll = ${o.nextChangeAt !== null}, next_poll_at = ${o.nextChangeAt ?? now}
          ${
            statusChanged
              ? tx`, status = ${o.status}, installation_status = ${active ? 'FINISHED' : o.status === 'ERROR' ? 'ERROR' : 'PENDING'},
                   installation_progress = ${o.installationProgress}, installation_failure = ${o.installationFailure},
                   ip = ${o.ip}, ssh_connection = ${o.sshConnection}, port_mapping = ${tx.json(o.portMapping as never)},
                   active_at = ${active ? now : null}, updated_at = ${now}`
              : tx``
          }
        WHERE id = ${p.id} AND terminated_at IS NULL AND status = ${p.status}
        RETURNING wallet_id, price_hr_units, prepaid_until`;
      if (!cur) return; // deleted, or moved on by another poller, meanwhile
      if (statusChanged && active) {
        // Billing switches to the active rate now, or when the prepaid hours end if later.
        const at = cur.prepaid_until && cur.prepaid_until > now ? cur.prepaid_until : now;
        await openMeter(tx, { walletId: cur.wallet_id, resourceType: 'pod', resourceId: p.id, state: 'ACTIVE', rateUnitsPerHr: cur.price_hr_units, at });
      }
      const ids = Object.keys(o.disks);
      if (ids.length) {
        await tx`
          UPDATE pod_disks pd SET status = v.status,
                 attached_at = CASE WHEN v.status IN ('ATTACHED', 'MOUNTED') THEN COALESCE(pd.attached_at, ${now}) ELSE pd.attached_at END,
                 mounted_at = CASE WHEN v.status = 'MOUNTED' THEN COALESCE(pd.mounted_at, ${now}) ELSE pd.mounted_at END
          FROM unnest(${ids}::text[], ${ids.map((id) => o.disks[id]!)}::text[]) AS v(disk_id, status)
          WHERE pd.pod_id = ${p.id} AND pd.disk_id = v.disk_id AND pd.status <> v.status AND pd.detached_at IS NULL`;
      }
      await refreshDocs(tx, [p.id]);
    });
  }

  /** Provisions and polls the disks due; answers whether it took a full batch. */
  private async disks(): Promise<boolean> {
    const due = await this.sql<{ id: string; provider_id: string; provider_ref: string | null; data_center_id: string; size_gb: number; created_at: Date; wallet_id: string; price_hr_units: number }[]>`
      SELECT id, provider_id, provider_ref, data_center_id, size_gb, created_at, wallet_id, price_hr_units
      FROM disks WHERE status = 'PROVISIONING' AND ready_at <= clock_timestamp()
      ORDER BY ready_at LIMIT ${BATCH_MAX}`;
    for (const d of due) {
      try {
        const provider = await this.providers.forProvider(d.provider_id);
        const spec = { diskId: d.id, dataCenterId: d.data_center_id, sizeGb: d.size_gb, requestedAt: d.created_at };
        let ref = d.provider_ref;
        if (!ref) {
          const made = await provider.provisionDisk(spec);
          ref = made.ref;
          await this.sql`UPDATE disks SET provider_ref = ${ref}, ready_at = ${made.readyAt} WHERE id = ${d.id} AND provider_ref IS NULL`;
          if (made.readyAt.getTime() > Date.now()) continue;
        }
        const now = new Date();
        const o = await provider.pollDisk(ref, spec, now);
        if (o.status === 'PROVISIONING') {
          await this.sql`UPDATE disks SET ready_at = ${o.nextChangeAt ?? new Date(Date.now() + RETRY_MS)} WHERE id = ${d.id}`;
          continue;
        }
        await this.sql.begin(async (tx) => {
          const [cur] = await tx<{ status: string }[]>`SELECT status FROM disks WHERE id = ${d.id} FOR UPDATE`;
          if (cur?.status !== 'PROVISIONING') return;
          await tx`UPDATE disks SET status = ${o.status}, updated_at = ${now} WHERE id = ${d.id}`;
          await openMeter(tx, { walletId: d.wallet_id, resourceType: 'disk', resourceId: d.id, state: o.status, rateUnitsPerHr: d.price_hr_units, at: now });
        });
      } catch (e) {
        log.warn({ err: e, diskId: d.id }, 'disk poll failed; retrying');
        await this.sql`UPDATE disks SET ready_at = ${new Date(Date.now() + RETRY_MS)} WHERE id = ${d.id}`;
      }
    }
    return due.length === BATCH_MAX;
  }
}
