// What the platform needs from a GPU cloud. A driver provisions, reports state
// when polled, and terminates; the platform keeps the records, capacity and
// billing, and applies what a poll reports (src/platform/reconciler.ts).

export interface PortMapping {
  internal: string;
  external: string;
  protocol: string;
  usedBy: string | null;
  description: string;
}

export interface PodSpecForProvider {
  podId: string;
  dataCenterId: string;
  nodeId: string;
  gpuType: string;
  gpuCount: number;
  image: string;
  vcpus: number;
  memoryGb: number;
  diskGb: number;
  diskIds: string[];
  /** The offer's estimate, unscaled minutes. */
  provisioningMinutes: number;
  requestedAt: Date;
}

export type AttachmentStatus = 'UNATTACHED' | 'ATTACHED' | 'MOUNTED';

export interface PodObservation {
  status: 'PROVISIONING' | 'ACTIVE' | 'ERROR';
  installationProgress: number | null;
  installationFailure: string | null;
  ip: string | null;
  sshConnection: string | null;
  portMapping: PortMapping[];
  /** Status of each persistent disk, by id. */
  disks: Record<string, AttachmentStatus>;
  /** When the next change is expected (lets the poller sleep); null when settled. */
  nextChangeAt: Date | null;
}

export interface DiskSpecForProvider {
  diskId: string;
  dataCenterId: string;
  sizeGb: number;
  requestedAt: Date;
}

export interface DiskObservation {
  status: 'PROVISIONING' | 'ACTIVE' | 'ERROR';
  nextChangeAt: Date | null;
}

export interface Provider {
  readonly driver: string;
  /** Starts a pod; answers the provider's reference for it. */
  provision(spec: PodSpecForProvider): Promise<string>;
  poll(ref: string, spec: PodSpecForProvider, now: Date): Promise<PodObservation>;
  terminate(ref: string): Promise<void>;
  /** How long after a pod ends its disks are free again (detachment). */
  detachDelayMs(): number;
  provisionDisk(spec: DiskSpecForProvider): Promise<{ ref: string; readyAt: Date }>;
  pollDisk(ref: string, spec: DiskSpecForProvider, now: Date): Promise<DiskObservation>;
  terminateDisk(ref: string): Promise<void>;
}
