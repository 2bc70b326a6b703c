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

/**
 * Per-token series: one label, whose value names the series (a model), kept in a Map by it;
 * an observation is a lookup and a few additions, with nothing allocated. prom-client builds a
 * label object and a hash string on every observation: the per-token histograms and counter
 * were ~550 B of garbage a token, 14 % of what the HTTP thread allocated a token under 16
 * streams, and every byte brings the next scavenge (a pause of that thread) closer
 * (bench/README.md "Per-token metrics without garbage"). Served through the port's registry as
 * prom-client's own series are, in the same text.
 */
abstract class HotMetric<S> {
  protected readonly series = new Map<string, S>();
  readonly aggregator = 'sum' as const;
  constructor(
    readonly name: string,
    readonly help: string,
    /** The one label's name; its values are the series' keys. */
    protected readonly label: string,
    port: MetricsPort,
  ) {
    const r = registries[port];
    // Get-or-create as above: a module loaded twice (tests) takes over the registered name.
    if (r.getSingleMetric(name)) r.removeSingleMetric(name);
    r.registerMetric(this as unknown as client.Metric);
  }
  reset(): void {
    this.series.clear();
  }
  /** The registry's view (prom-client's metric `get`): labels and values, shared labels apart as prom-client writes them. */
  abstract getForPromString(): { name: string; help: string; type: string; aggregator: 'sum'; values: HotValue[] };
  get(): { name: string; help: string; type: string; aggregator: 'sum'; values: Array<Omit<HotValue, 'sharedLabels'>> } {
    const m = this.getForPromString();
    return { ...m, values: m.values.map(({ labels, sharedLabels, ...v }) => ({ ...v, labels: { ...labels, ...sharedLabels } })) };
  }
}
interface HotValue {
  labels: Record<string, string | number>;
  sharedLabels: Record<string, string>;
  value: number;
  metricName?: string;
}

/** A histogram of per-token figures (see HotMetric). */
export class HotHistogram extends HotMetric<{ counts: Float64Array; sum: number; count: number; shared: Record<string, string> }> {
  readonly type = 'histogram';
  private readonly buckets: number[];
  constructor(cfg: { name: string; help: string; label: string; buckets: number[] }, port: MetricsPort) {
    super(cfg.name, cfg.help, cfg.label, port);
    this.buckets = [...cfg.buckets].sort((a, b) => a - b);
  }

  observe(labelValue: string, v: number): void {
    // As prom-client refuses them: a value that is no number would make the series' sum NaN for good.
    if (!Number.isFinite(v)) throw new TypeError(`${this.name}: an observation must be a finite number, got ${v}`);
    let s = this.series.get(labelValue);
    if (!s) this.series.set(labelValue, (s = { counts: new Float64Array(this.buckets.length), sum: 0, count: 0, shared: { [this.label]: labelValue } }));
    // The first bucket whose bound holds it (le: bound inclusive, as Prometheus reads it); none: +Inf only.
    const b = this.buckets;
    let i = 0;
    while (i < b.length && v > b[i]!) i++;
    if (i < b.length) s.counts[i]!++;
    s.sum += v;
    s.count++;
  }

  getForPromString(): { name: string; help: string; type: string; aggregator: 'sum'; values: HotValue[] } {
    const values: HotValue[] = [];
    for (const s of this.series.values()) {
      let acc = 0;
      this.buckets.forEach((le, i) => values.push({ labels: { le }, sharedLabels: s.shared, value: (acc += s.counts[i]!), metricName: `${this.name}_bucket` }));
      values.push({ labels: { le: '+Inf' }, sharedLabels: s.shared, value: s.count, metricName: `${this.name}_bucket` });
      values.push({ labels: {}, sharedLabels: s.shared, value: s.sum, metricName: `${this.name}_sum` });
      values.push({ labels: {}, sharedLabels: s.shared, value: s.count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }
}

/** A counter of per-token events (see HotMetric). */
export class HotCounter extends HotMetric<{ value: number; shared: Record<string, string> }> {
  readonly type = 'counter';
  constructor(cfg: { name: string; help: string; label: string }, port: MetricsPort) {
    super(cfg.name, cfg.help, cfg.label, port);
  }
  inc(labelValue: string, v = 1): void {
    if (!(v >= 0) || !Number.isFinite(v)) throw new TypeError(`${this.name}: a counter goes up by a finite number of at least 0, got ${v}`);
    const s = this.series.get(labelValue);
    if (s) s.value += v;
    else this.series.set(labelValue, { value: v, shared: { [this.label]: labelValue } });
  }
  getForPromString(): { name: string; help: string; type: string; aggregator: 'sum'; values: HotValue[] } {
    const values: HotValue[] = [];
    for (const s of this.series.values()) values.push({ labels: {}, sharedLabels: s.shared, value: s.value });
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }
}
