import { describe, expect, it } from 'vitest';
import { ApiError } from '../errors.js';
import { diskPriceUnits, normaliseSpec, podPrice, resolveCount, resourceChargeUsd } from './pricing.js';

const adjustable = (included: boolean) => normaliseSpec({ minCount: 100, maxCount: 1000, defaultCount: 200, pricePerUnit: 0.0001, step: 50, defaultIncludedInPrice: included });
const fixed = normaliseSpec({ defaultCount: 16 });

function refusal(f: () => unknown): ApiError {
  try {
    f();
  } catch (e) {
    return e as ApiError;
  }
  throw new Error('expected a refusal');
}

describe('resolveCount', () => {
  it('uses the default when nothing is sent and accepts the boundaries and steps', () => {
    const s = adjustable(true);
    expect(resolveCount(s, undefined, 'pod.diskSize')).toBe(200);
    expect(resolveCount(s, null, 'pod.diskSize')).toBe(200);
    expect(resolveCount(s, 100, 'pod.diskSize')).toBe(100);
    expect(resolveCount(s, 1000, 'pod.diskSize')).toBe(1000);
    expect(resolveCount(s, 150, 'pod.diskSize')).toBe(150);
  });

  it('refuses one past each boundary and a value off the step, naming the field, rule and value', () => {
    const s = adjustable(true);
    const below = refusal(() => resolveCount(s, 99, 'pod.diskSize'));
    expect(below.kind).toBe('invalid');
    expect(below.param).toBe('pod.diskSize');
    expect(below.message).toContain('at least 100');
    expect(below.message).toContain('99');
    expect(refusal(() => resolveCount(s, 1001, 'pod.diskSize')).message).toContain('at most 1000');
    expect(refusal(() => resolveCount(s, 120, 'pod.diskSize')).message).toContain('multiple of 50');
  });

  it('treats a spec with only defaultCount as fixed', () => {
    expect(resolveCount(fixed, undefined, 'pod.vcpus')).toBe(16);
    expect(resolveCount(fixed, 16, 'pod.vcpus')).toBe(16);
    expect(refusal(() => resolveCount(fixed, 17, 'pod.vcpus')).message).toContain('fixed at 16');
  });
});

describe('pricing rules (SPEC 2.11)', () => {
  it('charges nothing for an included default, and all units for any other count', () => {
    const s = adjustable(true);
    expect(resourceChargeUsd(s, 200)).toBe(0);
    expect(resourceChargeUsd(s, 250)).toBeCloseTo(0.025, 10);
    expect(resourceChargeUsd(s, 150)).toBeCloseTo(0.015, 10);
  });

  it('charges the default at pricePerUnit when it is not included', () => {
    expect(resourceChargeUsd(adjustable(false), 200)).toBeCloseTo(0.02, 10);
  });

  it('adds onDemand and the disk, vCPU and memory charges, rounded to stored units', () => {
    const memory = normaliseSpec({ minCount: 8, maxCount: 128, defaultCount: 64, pricePerUnit: 0.002, step: 8, defaultIncludedInPrice: false });
    const p = podPrice(20_000, { disk: adjustable(true), vcpu: fixed, memory }, { disk: 300, vcpus: 16, memory: 64 });
    // 2.00 + 300 x 0.0001 + 0 + 64 x 0.002 = 2.158 USD
    expect(p.priceHrUnits).toBe(21_580);
    expect(p.provisioningPriceHrUnits).toBe(300);
    expect(p.stoppedPriceHrUnits).toBe(300);
  });

  it('prices a disk at size times price per GB per hour', () => {
    expect(diskPriceUnits(normaliseSpec({ pricePerUnit: 0.0002 }), 250)).toBe(500);
  });
});
