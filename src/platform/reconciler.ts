import type { Sql } from '../db/index.js';
import { log } from '../log.js';
import { openMeter } from '../money/ledger.js';
import { usd } from './common.js';
import type { PodObservation, PodSpecForProvider } from './providers/provider.js';
import type { Providers } from './providers/index.js';

// Drives providers: provisions pods and disks that were ordered, polls the ones
// still changing, and applies what a poll reports (status, connection data,
// disk attachment) together with the billing change, in one transaction per
// change. Rows carry their next poll time, so an idle platform costs one
// indexed query per tick; state lives in the database, so a restart resumes.

/** How often due rows are looked for. Short enough that a scaled test offer is seen ready promptly. */
const TICK_MS = 100;
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

export class Reconciler {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;

  constructor(
    private readonly sql: Sql,
    private readonly providers: Providers,
  ) {}

  start(): void {
    const loop = () => {
      if (this.stopped) return;
      this.running = this.tick()
        .catch((e) => log.error({ err: e }, 'reconciler tick failed'))
        .finally(() => {
          this.running = undefined;
          if (!this.stopped) this.timer = setTimeout(loop, TICK_MS);
        });
    };
    this.timer = setTimeout(loop, TICK_MS);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.running;
  }

  async tick(): Promise<void> {
    await this.pods();
    await this.disks();
  }

  private async pods(): Promise<void> {
    const due = await this.sql<DuePod[]>`
      SELECT p.id, p.provider_id, p.provider_ref, p.node_id, p.data_center_id, p.gpu_name, p.gpu_count, p.environment_type,
             p.vcpus, p.memory_gb, p.disk_gb, p.provisioning_minutes, p.created_at, p.status,
             COALESCE((SELECT array_agg(pd.disk_id ORDER BY pd.position) FROM pod_disks pd WHERE pd.pod_id = p.id), '{}') AS disk_ids
      FROM pods p
      WHERE p.needs_poll AND p.terminated_at IS NULL AND p.next_poll_at <= clock_timestamp()
      ORDER BY p.next_poll_at LIMIT ${BATCH_MAX}`;
    for (const p of due) {
      try {
        const provider = await this.providers.forProvider(p.provider_id);
        const spec = specOf(p);
        let ref = p.provider_ref;
        if (!ref) {
          ref = await provider.provision(spec);
          await this.sql`UPDATE pods SET provider_ref = ${ref} WHERE id = ${p.id} AND provider_ref IS NULL`;
        }
        const now = new Date();
        await this.apply(p, await provider.poll(ref, spec, now), now);
      } catch (e) {
        log.warn({ err: e, podId: p.id }, 'pod poll failed; retrying');
        await this.sql`UPDATE pods SET next_poll_at = ${new Date(Date.now() + RETRY_MS)} WHERE id = ${p.id}`;
      }
    }
  }

  /** Applies one observation. The row is re-read under its lock: a pod deleted meanwhile is left alone. */
  private async apply(p: DuePod, o: PodObservation, now: Date): Promise<void> {
    await this.sql.begin(async (tx) => {
      const [cur] = await tx<{ status: string; wallet_id: string; price_hr_units: number; prepaid_until: Date | null; terminated_at: Date | null }[]>`
        SELECT status, wallet_id, price_hr_units, prepaid_until, terminated_at FROM pods WHERE id = ${p.id} FOR UPDATE`;
      if (!cur || cur.terminated_at) return;
      if (o.status !== cur.status) {
        const active = o.status === 'ACTIVE';
        await tx`
          UPDATE pods SET status = ${o.status}, installation_status = ${active ? 'FINISHED' : o.status === 'ERROR' ? 'ERROR' : 'PENDING'},
                 installation_progress = ${o.installationProgress}, installation_failure = ${o.installationFailure},
                 ip = ${o.ip}, ssh_connection = ${o.sshConnection}, port_mapping = ${tx.json(o.portMapping as never)},
                 active_at = ${active ? now : null}, updated_at = ${now}
          WHERE id = ${p.id}`;
        if (active) {
          // Billing switches to the active rate now, or when the prepaid hours end if later.
          const at = cur.prepaid_until && cur.prepaid_until > now ? cur.prepaid_until : now;
          await openMeter(tx, { walletId: cur.wallet_id, resourceType: 'pod', resourceId: p.id, state: 'ACTIVE', ratePerHrUsd: usd(cur.price_hr_units)!, at });
        }
      }
      for (const [diskId, status] of Object.entries(o.disks)) {
        await tx`
          UPDATE pod_disks SET status = ${status},
                 attached_at = CASE WHEN ${status} IN ('ATTACHED', 'MOUNTED') THEN COALESCE(attached_at, ${now}) ELSE attached_at END,
                 mounted_at = CASE WHEN ${status} = 'MOUNTED' THEN COALESCE(mounted_at, ${now}) ELSE mounted_at END
          WHERE pod_id = ${p.id} AND disk_id = ${diskId} AND status <> ${status} AND detached_at IS NULL`;
      }
      await tx`
        UPDATE pods SET needs_poll = ${o.nextChangeAt !== null}, next_poll_at = ${o.nextChangeAt ?? now}
        WHERE id = ${p.id}`;
    });
  }

  private async disks(): Promise<void> {
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
          await openMeter(tx, { walletId: d.wallet_id, resourceType: 'disk', resourceId: d.id, state: o.status, ratePerHrUsd: usd(d.price_hr_units)!, at: now });
        });
      } catch (e) {
        log.warn({ err: e, diskId: d.id }, 'disk poll failed; retrying');
        await this.sql`UPDATE disks SET ready_at = ${new Date(Date.now() + RETRY_MS)} WHERE id = ${d.id}`;
      }
    }
  }
}
