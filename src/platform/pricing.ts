import { invalid } from '../errors.js';
import { UNITS_PER_USD } from '../money/ledger.js';

// Resource specs and the pricing rules of SPEC 2.11, as pure functions.

/** A resource spec in the API's shape (SPEC 2.2). Counts in GB or vCPUs; price in USD per unit per hour. */
export interface ResourceSpec {
  minCount: number | null;
  maxCount: number | null;
  defaultCount: number | null;
  pricePerUnit: number | null;
  step: number | null;
  defaultIncludedInPrice: boolean | null;
  additionalInfo: string | null;
}

export const EMPTY_SPEC: ResourceSpec = {
  minCount: null,
  maxCount: null,
  defaultCount: null,
  pricePerUnit: null,
  step: null,
  defaultIncludedInPrice: null,
  additionalInfo: null,
};

/** Fills absent keys with null so responses always carry every key. */
export function normaliseSpec(s: Partial<ResourceSpec> | null | undefined): ResourceSpec {
  return { ...EMPTY_SPEC, ...(s ?? {}) };
}

/** A spec with only `defaultCount` is fixed: the default is the only value. */
export const isFixed = (s: ResourceSpec): boolean => s.minCount === null && s.maxCount === null;

/**
 * The value to use for a resource: the default when none is sent, else the sent
 * value checked against min, max and step. `param` names the field in errors.
 */
export function resolveCount(spec: ResourceSpec, sent: number | null | undefined, param: string): number {
  const def = spec.defaultCount ?? spec.minCount ?? 0;
  if (sent === null || sent === undefined) return def;
  if (!Number.isFinite(sent)) throw invalid(param, 'must be a number', sent);
  if (isFixed(spec)) {
    if (sent !== def) throw invalid(param, `is fixed at ${def} for this offer`, sent);
    return sent;
  }
  const min = spec.minCount ?? def;
  const max = spec.maxCount ?? def;
  if (sent < min) throw invalid(param, `must be at least ${min} for this offer`, sent);
  if (sent > max) throw invalid(param, `must be at most ${max} for this offer`, sent);
  const step = spec.step && spec.step > 0 ? spec.step : 1;
  // Steps count from the minimum (min 50, step 10: 50, 60, 70 ...); tolerate float noise.
  const k = (sent - min) / step;
  if (Math.abs(k - Math.round(k)) > 1e-9) throw invalid(param, `must be ${min} plus a multiple of ${step}`, sent);
  return sent;
}

/**
 * Hourly charge of one resource in USD (SPEC 2.11 rules 2 to 4): requested units
 * times price, except that an included default is free.
 */
export function resourceChargeUsd(spec: ResourceSpec, count: number): number {
  const price = spec.pricePerUnit ?? 0;
  if (price === 0) return 0;
  if (spec.defaultIncludedInPrice === true && count === spec.defaultCount) return 0;
  return count * price;
}

export interface PodPrice {
  /** Hourly price while active, stored units. */
  priceHrUnits: number;
  /** While provisioning and while stopped only storage is charged: the disk part. */
  provisioningPriceHrUnits: number;
  stoppedPriceHrUnits: number;
}

/** Hourly pod cost = onDemand + disk, vCPU and memory charges (rule 1), rounded to stored units. */
export function podPrice(
  onDemandUnits: number,
  specs: { disk: ResourceSpec; vcpu: ResourceSpec; memory: ResourceSpec },
  counts: { disk: number; vcpus: number; memory: number },
): PodPrice {
  const disk = resourceChargeUsd(specs.disk, counts.disk) * UNITS_PER_USD;
  const rest = (resourceChargeUsd(specs.vcpu, counts.vcpus) + resourceChargeUsd(specs.memory, counts.memory)) * UNITS_PER_USD;
  const diskUnits = Math.round(disk);
  return {
    priceHrUnits: onDemandUnits + Math.round(disk + rest),
    provisioningPriceHrUnits: diskUnits,
    stoppedPriceHrUnits: diskUnits,
  };
}

/** Disk hourly cost = size x price per GB per hour (rule 5), rounded to stored units. */
export const diskPriceUnits = (spec: ResourceSpec, sizeGb: number): number =>
  Math.round(sizeGb * (spec.pricePerUnit ?? 0) * UNITS_PER_USD);
