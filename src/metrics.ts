import client from 'prom-client';

// One registry per listening port, so a Prometheus that scrapes both ports (as
// anyone would) counts each figure once: no series is served on both.
//   platform (:8000 /metrics): process and Node.js runtime, the platform port's
//     HTTP series, money (meters, ledger) and platform series;
//   inference (:8001 /metrics): the inference port's HTTP series, the engine
//     (vLLM's `vllm:` names) and inference billing / rate limits.
// docs/metrics.md lists every series.
export const registries = { platform: new client.Registry(), inference: new client.Registry() };
export type MetricsPort = keyof typeof registries;

/**
 * Runtime metrics once per process, on the platform port. prom-client's three
 * `nodejs_active_*_total` gauges break promtool's rule that only counters end in
 * `_total`; they are replaced by `nodejs_active_resources` (what the event loop
 * waits on, by type: Node's getActiveResourcesInfo).
 */
let defaultsOn = false;
export function enableDefaultMetrics(): void {
  if (defaultsOn) return;
  defaultsOn = true;
  const r = registries.platform;
  client.collectDefaultMetrics({ register: r });
  for (const n of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) r.removeSingleMetric(n);
  gauge(
    {
      name: 'nodejs_active_resources',
      help: 'Resources keeping the event loop alive, by type (sockets, timers, file handles...)',
      labelNames: ['type'],
      collect() {
        this.reset();
        const counts = new Map<string, number>();
        for (const t of process.getActiveResourcesInfo()) counts.set(t, (counts.get(t) ?? 0) + 1);
        for (const [type, n] of counts) this.set({ type }, n);
      },
    },
    'platform',
  );
}

// Get-or-create on the port's registry, so modules loaded twice (tests) never throw "already registered".
export function counter<T extends string>(cfg: client.CounterConfiguration<T>, port: MetricsPort): client.Counter<T> {
  const r = registries[port];
  return (r.getSingleMetric(cfg.name) as client.Counter<T>) ?? new client.Counter({ ...cfg, registers: [r] });
}
export function gauge<T extends string>(cfg: client.GaugeConfiguration<T>, port: MetricsPort): client.Gauge<T> {
  const r = registries[port];
  return (r.getSingleMetric(cfg.name) as client.Gauge<T>) ?? new client.Gauge({ ...cfg, registers: [r] });
}
export function histogram<T extends string>(cfg: client.HistogramConfiguration<T>, port: MetricsPort): client.Histogram<T> {
  const r = registries[port];
  return (r.getSingleMetric(cfg.name) as client.Histogram<T>) ?? new client.Histogram({ ...cfg, registers: [r] });
}

/**
 * Buckets for request durations, 5 ms to 20 min: a request here can be a
 * sub-millisecond read or a stream of many minutes (a 4096-token completion
 * at a few tokens a second on a busy CPU), and a histogram whose top bucket is
 * below the slow end puts all of those in +Inf, where no quantile can be read.
 */
export const REQUEST_SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 240, 480, 960, 1200];
