import client from 'prom-client';

// prom-client's global registry: every module registers its metrics here and
// GET /metrics serialises it. Default process metrics once per process.
export const registry = client.register;
let defaultsOn = false;
export function enableDefaultMetrics(): void {
  if (defaultsOn) return;
  defaultsOn = true;
  client.collectDefaultMetrics({ register: registry });
}

/** Get-or-create, so modules loaded twice (tests) never throw "already registered". */
export function counter<T extends string>(cfg: client.CounterConfiguration<T>): client.Counter<T> {
  return (registry.getSingleMetric(cfg.name) as client.Counter<T>) ?? new client.Counter(cfg);
}
export function gauge<T extends string>(cfg: client.GaugeConfiguration<T>): client.Gauge<T> {
  return (registry.getSingleMetric(cfg.name) as client.Gauge<T>) ?? new client.Gauge(cfg);
}
export function histogram<T extends string>(cfg: client.HistogramConfiguration<T>): client.Histogram<T> {
  return (registry.getSingleMetric(cfg.name) as client.Histogram<T>) ?? new client.Histogram(cfg);
}
