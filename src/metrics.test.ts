import client from 'prom-client';
import { describe, expect, it } from 'vitest';
import { HotCounter, HotHistogram, registries } from './metrics.js';

// The hot series (per-token figures) must read exactly as prom-client's own would: dashboards and
// the metrics lint read the text, not the class behind it.
async function promClientText(make: (r: client.Registry) => void): Promise<string> {
  const r = new client.Registry();
  make(r);
  return r.metrics();
}

describe('hot metrics', () => {
  const buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01];
  // On a bound (le is inclusive), between bounds, past the last bound, and two models.
  const seen: Array<[string, number]> = [['a/m', 0.0005], ['a/m', 0.0007], ['b/m', 0.001], ['a/m', 0.003], ['a/m', 0.5], ['b/m', 0], ['a/m', 0.01]];

  it('a histogram reads as prom-client\'s Histogram of the same observations', async () => {
    const h = new HotHistogram({ name: 'test_hot_seconds', help: 'h', label: 'model_name', buckets }, 'inference');
    for (const [m, v] of seen) h.observe(m, v);
    const expected = await promClientText((r) => {
      const p = new client.Histogram({ name: 'test_hot_seconds', help: 'h', labelNames: ['model_name'], buckets, registers: [r] });
      for (const [m, v] of seen) p.observe({ model_name: m }, v);
    });
    expect(await registries.inference.getSingleMetricAsString('test_hot_seconds')).toBe(expected.trim());
    expect(expected).toContain('test_hot_seconds_bucket{le="0.0005",model_name="a/m"} 1');
    expect((await registries.inference.getMetricsAsJSON()).find((m) => m.name === 'test_hot_seconds')?.values[0]).toEqual({ labels: { le: 0.0005, model_name: 'a/m' }, value: 1, metricName: 'test_hot_seconds_bucket' });
  });

  it('a counter reads as prom-client\'s Counter, and a reset empties both kinds', async () => {
    const c = new HotCounter({ name: 'test_hot_total', help: 'c', label: 'model_name' }, 'inference');
    for (const [m] of seen) c.inc(m);
    c.inc('b/m', 5);
    const expected = await promClientText((r) => {
      const p = new client.Counter({ name: 'test_hot_total', help: 'c', labelNames: ['model_name'], registers: [r] });
      for (const [m] of seen) p.inc({ model_name: m });
      p.inc({ model_name: 'b/m' }, 5);
    });
    expect(await registries.inference.getSingleMetricAsString('test_hot_total')).toBe(expected.trim());
    expect(expected).toContain('test_hot_total{model_name="b/m"} 7');
    c.reset();
    expect(await registries.inference.getSingleMetricAsString('test_hot_total')).toBe('# HELP test_hot_total c\n# TYPE test_hot_total counter');
  });

  it('refuses what prom-client refuses: an observation that is no finite number, a counter going down', () => {
    const h = new HotHistogram({ name: 'test_hot_refuse_seconds', help: 'h', label: 'model_name', buckets }, 'inference');
    expect(() => h.observe('a/m', Number.NaN)).toThrow('test_hot_refuse_seconds: an observation must be a finite number, got NaN');
    const c = new HotCounter({ name: 'test_hot_refuse_total', help: 'c', label: 'model_name' }, 'inference');
    expect(() => c.inc('a/m', -1)).toThrow('test_hot_refuse_total: a counter goes up by a finite number of at least 0, got -1');
    expect(() => c.inc('a/m', Number.POSITIVE_INFINITY)).toThrow('got Infinity');
  });

  it('a second one of the same name takes the name over (a module loaded twice) and counts from zero', async () => {
    new HotCounter({ name: 'test_hot_again_total', help: 'c', label: 'model_name' }, 'inference').inc('x', 3);
    const again = new HotCounter({ name: 'test_hot_again_total', help: 'c', label: 'model_name' }, 'inference');
    again.inc('x');
    expect(await registries.inference.getSingleMetricAsString('test_hot_again_total')).toContain('test_hot_again_total{model_name="x"} 1');
  });
});
