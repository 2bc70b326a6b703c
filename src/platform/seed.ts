import type { Sql } from '../db/index.js';
import { unitsToUsd, usdToUnits } from '../money/ledger.js';
import { importCatalog } from './inventory.js';
import type { Catalog } from './protocol.js';

// The catalog a fresh database starts with: several providers, regions and data
// centers, GPU types including CPU_NODE, fixed and adjustable specs, included
// and charged defaults, variable, spot and prepaid offers, single and multinode
// disk offers. Applied at every start with "keep" semantics: rows that exist
// (and the capacity pods hold on them) are left alone, so seeding is idempotent.

type Spec = NonNullable<Catalog['gpuOffers']>[number]['disk'];
type GpuOffer = NonNullable<Catalog['gpuOffers']>[number];
type Node = NonNullable<Catalog['nodes']>[number];

const IMAGES_GPU = ['ubuntu_22_cuda_12', 'cuda_12_4_pytorch_2_5', 'vllm_llm_inference', 'flux_comfyui', 'axolotl', 'prime_rl'];
const IMAGES_CPU = ['ubuntu_22', 'ubuntu_24'];

const fixed = (defaultCount: number, additionalInfo: string | null = null): Spec => ({ defaultCount, additionalInfo });
const adjustable = (min: number, max: number, def: number, price: number, step: number, included: boolean, additionalInfo: string | null = null): Spec => ({
  minCount: min,
  maxCount: max,
  defaultCount: def,
  pricePerUnit: price,
  step,
  defaultIncludedInPrice: included,
  additionalInfo,
});

interface GpuKind {
  type: string;
  memory: number;
  socket: string;
  /** On-demand USD per GPU-hour. */
  price: number;
  interconnect: number | null;
  interconnectType: string | null;
  perNode: number;
}

const KINDS: Record<string, GpuKind> = {
  H100_SXM: { type: 'H100_80GB', memory: 80, socket: 'SXM', price: 2.49, interconnect: 900, interconnectType: 'NVLink', perNode: 8 },
  H100_PCIE: { type: 'H100_80GB', memory: 80, socket: 'PCIe', price: 1.99, interconnect: null, interconnectType: null, perNode: 8 },
  H200: { type: 'H200_141GB', memory: 141, socket: 'SXM', price: 3.59, interconnect: 900, interconnectType: 'NVLink', perNode: 8 },
  B200: { type: 'B200_180GB', memory: 180, socket: 'SXM', price: 5.49, interconnect: 1800, interconnectType: 'NVLink', perNode: 8 },
  A100_SXM: { type: 'A100_80GB', memory: 80, socket: 'SXM', price: 1.29, interconnect: 600, interconnectType: 'NVLink', perNode: 8 },
  A100_PCIE: { type: 'A100_80GB', memory: 80, socket: 'PCIe', price: 1.19, interconnect: null, interconnectType: null, perNode: 8 },
  L40S: { type: 'L40S_48GB', memory: 48, socket: 'PCIe', price: 0.99, interconnect: null, interconnectType: null, perNode: 8 },
  A6000: { type: 'RTX_A6000_48GB', memory: 48, socket: 'PCIe', price: 0.49, interconnect: null, interconnectType: null, perNode: 4 },
  RTX4090: { type: 'RTX4090_24GB', memory: 24, socket: 'PCIe', price: 0.39, interconnect: null, interconnectType: null, perNode: 4 },
};

interface ProviderPlan {
  id: string;
  name: string;
  maxDisksPerPod: number;
  dcs: { id: string; name: string; region: string; country: string }[];
  kinds: (keyof typeof KINDS)[];
  nodesPerKind: number;
  counts: number[];
  cloudId: (k: GpuKind, count: number) => string;
  security: string;
  disk: Spec;
  vcpuPerGpu: number;
  memoryPerGpu: number;
  adjustable: boolean;
  provisioningTime: number;
  priceFactor: number;
  isVariable?: boolean;
  isSpot?: boolean;
  prepaidTime?: number;
  internetSpeed: number;
  diskOffer?: { cloudId: string | null; pricePerGb: number; isMultinode: boolean; maxGb: number; capacityGb: number };
}

const PLANS: ProviderPlan[] = [
  {
    id: 'hyperstack',
    name: 'Hyperstack',
    maxDisksPerPod: 5,
    dcs: [
      { id: 'CANADA-1', name: 'Montreal', region: 'canada', country: 'CA' },
      { id: 'NORWAY-1', name: 'Oslo', region: 'europe_north', country: 'NO' },
      { id: 'US-1', name: 'Dallas', region: 'united_states', country: 'US' },
    ],
    kinds: ['H100_SXM', 'H100_PCIE', 'A100_PCIE', 'L40S'],
    nodesPerKind: 3,
    counts: [1, 2, 4, 8],
    cloudId: (k, n) => `n3-${k.type.split('_')[0]}${k.socket === 'SXM' ? '-SXM5' : ''}x${n}`,
    security: 'secure_cloud',
    disk: adjustable(100, 20_000, 100, 0.0001, 10, true, 'Ephemeral NVMe; the default size is included'),
    vcpuPerGpu: 28,
    memoryPerGpu: 180,
    adjustable: false,
    provisioningTime: 8,
    priceFactor: 1,
    internetSpeed: 10_000,
    diskOffer: { cloudId: 'hyperstack-shared-storage', pricePerGb: 0.0001, isMultinode: true, maxGb: 100_000, capacityGb: 2_000_000 },
  },
  {
    id: 'datacrunch',
    name: 'DataCrunch',
    maxDisksPerPod: 3,
    dcs: [
      { id: 'FIN-01', name: 'Helsinki 1', region: 'europe_north', country: 'FI' },
      { id: 'ICE-01', name: 'Keflavik', region: 'europe_north', country: 'IS' },
    ],
    kinds: ['H200', 'B200', 'H100_SXM', 'A100_SXM'],
    nodesPerKind: 2,
    counts: [1, 2, 4, 8],
    cloudId: (k, n) => `${n}${k.type.split('_')[0]}.${k.memory}S.${n * 30}V`,
    security: 'secure_cloud',
    disk: adjustable(50, 10_000, 200, 0.00014, 50, false, 'Block storage, charged per GB'),
    vcpuPerGpu: 30,
    memoryPerGpu: 185,
    adjustable: false,
    provisioningTime: 6,
    priceFactor: 1.05,
    internetSpeed: 25_000,
    diskOffer: { cloudId: null, pricePerGb: 0.00014, isMultinode: false, maxGb: 40_000, capacityGb: 1_000_000 },
  },
  {
    id: 'lambdalabs',
    name: 'Lambda',
    maxDisksPerPod: 0,
    dcs: [
      { id: 'us-east-1', name: 'Virginia', region: 'united_states', country: 'US' },
      { id: 'us-west-1', name: 'California', region: 'united_states', country: 'US' },
    ],
    kinds: ['H100_SXM', 'A100_SXM', 'A6000'],
    nodesPerKind: 2,
    counts: [1, 8],
    cloudId: (k, n) => `gpu_${n}x_${k.type.split('_')[0]!.toLowerCase()}${k.socket === 'SXM' ? '_sxm' : ''}`,
    security: 'secure_cloud',
    disk: fixed(512, 'Local NVMe'),
    vcpuPerGpu: 26,
    memoryPerGpu: 225,
    adjustable: false,
    provisioningTime: 5,
    priceFactor: 0.98,
    internetSpeed: 10_000,
  },
  {
    id: 'fluidstack',
    name: 'FluidStack',
    maxDisksPerPod: 2,
    dcs: [
      { id: 'GB-LON-1', name: 'London', region: 'europe_west', country: 'GB' },
      { id: 'DE-FRA-1', name: 'Frankfurt', region: 'europe_west', country: 'DE' },
    ],
    kinds: ['H100_PCIE', 'L40S', 'RTX4090'],
    nodesPerKind: 2,
    counts: [1, 2, 4],
    cloudId: (k, n) => `fs-${k.type.toLowerCase()}-${n}`,
    security: 'secure_cloud',
    disk: adjustable(40, 4000, 100, 0.00012, 20, true),
    vcpuPerGpu: 16,
    memoryPerGpu: 96,
    adjustable: true,
    provisioningTime: 12,
    priceFactor: 0.95,
    isVariable: true,
    internetSpeed: 5000,
    diskOffer: { cloudId: 'fs-volume', pricePerGb: 0.00012, isMultinode: false, maxGb: 10_000, capacityGb: 500_000 },
  },
  {
    id: 'runpod',
    name: 'RunPod',
    maxDisksPerPod: 1,
    dcs: [
      { id: 'EU-RO-1', name: 'Bucharest', region: 'europe_east', country: 'RO' },
      { id: 'EU-NL-1', name: 'Amsterdam', region: 'europe_west', country: 'NL' },
      { id: 'US-TX-3', name: 'Texas 3', region: 'united_states', country: 'US' },
    ],
    kinds: ['RTX4090', 'A6000', 'L40S'],
    nodesPerKind: 2,
    counts: [1, 2],
    cloudId: (k) => `NVIDIA ${k.type.replace(/_\d+GB$/, '').replace('_', ' ')}`,
    security: 'community_cloud',
    disk: adjustable(20, 1000, 50, 0.00014, 10, false),
    vcpuPerGpu: 8,
    memoryPerGpu: 48,
    adjustable: false,
    provisioningTime: 3,
    priceFactor: 0.7,
    isSpot: true,
    internetSpeed: 1000,
    diskOffer: { cloudId: null, pricePerGb: 0.0001, isMultinode: false, maxGb: 4000, capacityGb: 200_000 },
  },
  {
    id: 'massedcompute',
    name: 'Massed Compute',
    maxDisksPerPod: 1,
    dcs: [{ id: 'US-KC-1', name: 'Kansas City', region: 'united_states', country: 'US' }],
    kinds: ['H100_SXM', 'A100_SXM'],
    nodesPerKind: 2,
    counts: [8],
    cloudId: (k, n) => `mc-${k.type.split('_')[0]!.toLowerCase()}-x${n}-reserved`,
    security: 'secure_cloud',
    disk: fixed(2000, 'Local NVMe'),
    vcpuPerGpu: 24,
    memoryPerGpu: 200,
    adjustable: false,
    provisioningTime: 20,
    priceFactor: 0.85,
    prepaidTime: 24,
    internetSpeed: 10_000,
  },
];

/** CPU-only instances: gpuType CPU_NODE, one slot per instance, vCPUs and memory adjustable and charged. */
const CPU_DCS = [
  { provider: 'hyperstack', dc: 'US-1' },
  { provider: 'fluidstack', dc: 'DE-FRA-1' },
];

/** A price at the ledger's resolution (one unit). */
const round4 = (x: number) => unitsToUsd(usdToUnits(x));

export function seedCatalog(): Catalog {
  const c: { [K in keyof Catalog]-?: NonNullable<Catalog[K]> } = { providers: [], dataCenters: [], contracts: [], nodes: [], clusters: [], assignments: [], gpuOffers: [], diskOffers: [] };
  for (const p of PLANS) {
    c.providers.push({ id: p.id, name: p.name, driver: 'simulated', maxDisksPerPod: p.maxDisksPerPod });
    const contract = `${p.id}-2025-capacity`;
    c.contracts.push({ id: contract, providerId: p.id, name: `${p.name} capacity agreement 2025`, status: 'ACTIVE' });
    for (const dc of p.dcs) {
      c.dataCenters.push({ id: dc.id, providerId: p.id, name: dc.name, region: dc.region, country: dc.country });
      const dcNodes: Node[] = [];
      for (const kk of p.kinds) {
        const k = KINDS[kk]!;
        for (let i = 1; i <= p.nodesPerKind; i++) {
          dcNodes.push({
            id: `${dc.id.toLowerCase()}-${kk.toLowerCase()}-${i}`,
            dataCenterId: dc.id,
            contractId: contract,
            hostname: `${kk.toLowerCase()}-${i}.${dc.id.toLowerCase()}.${p.id}.internal`,
            status: 'ACTIVE',
            gpuType: k.type,
            gpuCount: k.perNode,
            gpuMemory: k.memory,
            socket: k.socket,
            interconnect: k.interconnect,
            interconnectType: k.interconnectType,
            vcpus: p.vcpuPerGpu * k.perNode,
            memory: p.memoryPerGpu * k.perNode,
            disk: 30_000,
          });
        }
        for (const n of p.counts.filter((x) => x <= k.perNode)) {
          const offer: GpuOffer = {
            id: `${p.id}:${dc.id}:${kk}:${n}`,
            dataCenterId: dc.id,
            cloudId: p.cloudId(k, n),
            gpuType: k.type,
            gpuCount: n,
            gpuMemory: k.memory,
            socket: k.socket,
            security: p.security,
            disk: p.disk,
            vcpu: p.adjustable ? adjustable(4 * n, p.vcpuPerGpu * n, 8 * n, 0.01, 4, true) : fixed(p.vcpuPerGpu * n),
            memory: p.adjustable ? adjustable(16 * n, p.memoryPerGpu * n, 64 * n, 0.003, 16, true) : fixed(p.memoryPerGpu * n),
            sharedDisk: null,
            internetSpeed: p.internetSpeed,
            interconnect: n > 1 ? k.interconnect : null,
            interconnectType: n > 1 ? k.interconnectType : null,
            provisioningTime: p.provisioningTime + (n >= 8 ? 4 : 0),
            onDemand: round4(k.price * p.priceFactor * n),
            isVariable: p.isVariable ?? false,
            isSpot: p.isSpot ?? false,
            prepaidTime: p.prepaidTime ?? null,
            images: IMAGES_GPU,
          };
          c.gpuOffers.push(offer);
        }
      }
      c.nodes.push(...dcNodes);
      if (p.diskOffer) {
        const d = p.diskOffer;
        c.diskOffers.push({
          id: `${p.id}:${dc.id}:disk`,
          dataCenterId: dc.id,
          cloudId: d.cloudId,
          spec: adjustable(10, d.maxGb, 100, d.pricePerGb, 1, false, d.isMultinode ? 'Shared filesystem, attachable to several pods' : 'Network block volume'),
          security: p.security,
          isMultinode: d.isMultinode,
          capacityGb: d.capacityGb,
        });
      }
      // Multi-GPU providers run clusters: the first two 8-GPU nodes of the first kind form one.
      if (p.maxDisksPerPod >= 3) {
        const cluster = `${dc.id.toLowerCase()}-cluster-a`;
        c.clusters.push({ id: cluster, name: `${dc.name} cluster A`, dataCenterId: dc.id });
        dcNodes.slice(0, 2).forEach((n, i) => c.assignments.push({ id: `${cluster}-${n.id}`, nodeId: n.id, clusterId: cluster, status: i === 0 ? 'ACTIVE' : 'PENDING' }));
      }
    }
  }
  for (const { provider, dc } of CPU_DCS) {
    const contract = `${provider}-2025-capacity`;
    for (let i = 1; i <= 4; i++) {
      c.nodes.push({
        id: `${dc.toLowerCase()}-cpu-${i}`,
        dataCenterId: dc,
        contractId: contract,
        hostname: `cpu-${i}.${dc.toLowerCase()}.${provider}.internal`,
        status: 'ACTIVE',
        gpuType: 'CPU_NODE',
        gpuCount: 32,
        gpuMemory: 0,
        socket: 'PCIe',
        vcpus: 256,
        memory: 1024,
        disk: 20_000,
      });
    }
    c.gpuOffers.push({
      id: `${provider}:${dc}:CPU_NODE:1`,
      dataCenterId: dc,
      cloudId: `${provider}-cpu-general`,
      gpuType: 'CPU_NODE',
      gpuCount: 1,
      gpuMemory: 0,
      socket: 'PCIe',
      security: 'secure_cloud',
      disk: adjustable(20, 2000, 50, 0.0001, 10, false),
      vcpu: adjustable(2, 64, 4, 0.012, 2, false),
      memory: adjustable(4, 256, 16, 0.004, 4, false),
      sharedDisk: null,
      internetSpeed: 1000,
      interconnect: null,
      interconnectType: null,
      provisioningTime: 2,
      onDemand: 0,
      isVariable: false,
      isSpot: false,
      prepaidTime: null,
      images: IMAGES_CPU,
    });
  }
  return c;
}

/** Seeds under an advisory lock so daemons starting together do not race on it. */
const SEED_LOCK = 7_242_101;

export async function seed(sql: Sql): Promise<void> {
  const catalog = seedCatalog();
  await sql.begin(async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(${SEED_LOCK})`;
    await importCatalog(tx, catalog, 'keep');
  });
}
