import { describe, expect, it } from 'vitest';
import { glibcVersion, MALLOC_AS_SHIPPED, mallocSettingsMissing } from './malloc-settings.js';

describe('mallocSettingsMissing', () => {
  const GLIBC = '2.36';

  it('names both shipped settings where neither is set', () => {
    expect(mallocSettingsMissing({}, GLIBC)).toEqual(['MALLOC_ARENA_MAX=2', 'GLIBC_TUNABLES=glibc.malloc.tcache_count=1024']);
  });

  it("names none where npm start's are set, or the operator chose others", () => {
    expect(mallocSettingsMissing({ ...MALLOC_AS_SHIPPED }, GLIBC)).toEqual([]);
    expect(mallocSettingsMissing({ MALLOC_ARENA_MAX: '4', GLIBC_TUNABLES: 'glibc.malloc.mxfast=0:glibc.malloc.tcache_count=64' }, GLIBC)).toEqual([]);
  });

  it('names the thread cache where GLIBC_TUNABLES holds other tunables only', () => {
    expect(mallocSettingsMissing({ MALLOC_ARENA_MAX: '2', GLIBC_TUNABLES: 'glibc.malloc.mxfast=0' }, GLIBC)).toEqual(['GLIBC_TUNABLES=glibc.malloc.tcache_count=1024']);
    // a tunable whose name only starts the same is not the thread cache's count
    expect(mallocSettingsMissing({ MALLOC_ARENA_MAX: '2', GLIBC_TUNABLES: 'glibc.malloc.tcache_count_x=1' }, GLIBC)).toHaveLength(1);
  });

  it('names none off glibc', () => {
    expect(mallocSettingsMissing({}, undefined)).toEqual([]);
  });

  it("reads this machine's glibc (Debian's, where the tests run)", () => {
    if (process.platform === 'linux') expect(glibcVersion()).toMatch(/^2\.\d+$/);
    else expect(glibcVersion()).toBeUndefined();
  });
});
