import { createHash } from 'node:crypto';
import type { DiskObservation, DiskSpecForProvider, PodObservation, PodSpecForProvider, PortMapping, Provider } from './provider.js';

// The built-in provider: a simulation that walks the spec's states on the
// offer's provisioning time, scaled by PROVIDER_TIME_SCALE. It keeps no state:
// everything follows from the request time, so it survives restarts.

/** After the pod is up its disks attach, then mount; a real host takes tens of seconds. */
const MOUNT_DELAY_SECONDS = 30;
/** A network disk is created in about a minute on the clouds we mirror. */
const DISK_PROVISIONING_SECONDS = 60;
/** Detaching a disk from a terminated host: "can take a few moments" (SPEC 3.1). */
const DETACH_DELAY_SECONDS = 30;

function hashBytes(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** A stable public-looking address per pod (TEST-NET ranges, never routable). */
function ipFor(podId: string): string {
  const h = hashBytes(podId);
  const nets = ['192.0.2', '198.51.100', '203.0.113'];
  return `${nets[h[0]! % nets.length]}.${1 + (h[1]! % 254)}`;
}

export function portMappingFor(): PortMapping[] {
  return [
    { internal: '22', external: '22', protocol: 'TCP', usedBy: 'SSH', description: 'SSH' },
    { internal: '*', external: '*', protocol: 'TCP', usedBy: null, description: 'All other ports, mapped one to one' },
  ];
}

export class SimulatedProvider implements Provider {
  readonly driver = 'simulated';
  constructor(private readonly timeScale: number) {}

  private scaledMs(seconds: number): number {
    return Math.round(seconds * 1000 * this.timeScale);
  }

  async provision(spec: PodSpecForProvider): Promise<string> {
    return `sim-${spec.podId}`;
  }

  async poll(_ref: string, spec: PodSpecForProvider, now: Date): Promise<PodObservation> {
    const readyAt = spec.requestedAt.getTime() + this.scaledMs(spec.provisioningMinutes * 60);
    const mountedAt = readyAt + this.scaledMs(MOUNT_DELAY_SECONDS);
    const t = now.getTime();
    if (t < readyAt) {
      const disks = Object.fromEntries(spec.diskIds.map((id) => [id, 'UNATTACHED' as const]));
      return {
        status: 'PROVISIONING',
        installationProgress: 0,
        installationFailure: null,
        ip: null,
        sshConnection: null,
        portMapping: [],
        disks,
        nextChangeAt: new Date(readyAt),
      };
    }
    const mounted = t >= mountedAt;
    const ip = ipFor(spec.podId);
    return {
      status: 'ACTIVE',
      installationProgress: 100,
      installationFailure: null,
      ip,
      sshConnection: `root@${ip} -p 22`,
      portMapping: portMappingFor(),
      disks: Object.fromEntries(spec.diskIds.map((id) => [id, mounted ? ('MOUNTED' as const) : ('ATTACHED' as const)])),
      nextChangeAt: mounted || spec.diskIds.length === 0 ? null : new Date(mountedAt),
    };
  }

  async terminate(): Promise<void> {}

  detachDelayMs(): number {
    return this.scaledMs(DETACH_DELAY_SECONDS);
  }

  async provisionDisk(spec: DiskSpecForProvider): Promise<{ ref: string; readyAt: Date }> {
    return { ref: `sim-disk-${spec.diskId}`, readyAt: new Date(spec.requestedAt.getTime() + this.scaledMs(DISK_PROVISIONING_SECONDS)) };
  }

  async pollDisk(_ref: string, spec: DiskSpecForProvider, now: Date): Promise<DiskObservation> {
    const readyAt = spec.requestedAt.getTime() + this.scaledMs(DISK_PROVISIONING_SECONDS);
    return now.getTime() < readyAt ? { status: 'PROVISIONING', nextChangeAt: new Date(readyAt) } : { status: 'ACTIVE', nextChangeAt: null };
  }

  async terminateDisk(): Promise<void> {}
}
