import { describe, expect, it } from 'vitest';
import { lintMetrics, seriesOf } from './metrics-lint.js';

// The lint reproduces promtool's messages; each rule is shown to fire, so a clean
// scrape in test/metrics.test.ts means something.

const fam = (name: string, type: string, sample = `${name} 1`, help = 'some help') => `# HELP ${name} ${help}\n# TYPE ${name} ${type}\n${sample}\n`;
const texts = (t: string, exempt?: (n: string) => boolean) => lintMetrics(t, exempt).map((p) => `${p.metric}: ${p.text}`);

describe('promtool lint rules', () => {
  it('accepts well-named families of every type', () => {
    const ok =
      fam('http_requests_total', 'counter', 'http_requests_total{route="/a",status="200"} 3') +
      fam('queue_depth', 'gauge') +
      fam('request_duration_seconds', 'histogram', 'request_duration_seconds_bucket{le="0.1"} 1\nrequest_duration_seconds_bucket{le="+Inf"} 1\nrequest_duration_seconds_sum 0.05\nrequest_duration_seconds_count 1') +
      fam('rpc_seconds', 'summary', 'rpc_seconds{quantile="0.5"} 1\nrpc_seconds_sum 1\nrpc_seconds_count 1');
    expect(lintMetrics(ok)).toEqual([]);
  });

  it('reports what promtool reports', () => {
    expect(texts(fam('nodejs_active_handles_total', 'gauge'))).toEqual(['nodejs_active_handles_total: non-counter metrics should not have "_total" suffix']);
    expect(texts(fam('requests', 'counter'))).toEqual(['requests: counter metrics should have "_total" suffix']);
    expect(texts(`# TYPE no_help gauge\nno_help 1\n`)).toEqual(['no_help: no help text']);
    expect(texts(fam('latency_milliseconds', 'gauge'))).toEqual(['latency_milliseconds: use base unit "seconds" instead of "milliseconds"']);
    expect(texts(fam('uptime_hours', 'gauge'))).toEqual(['uptime_hours: use base unit "seconds" instead of "hours"']);
    expect(texts(fam('latency_ms', 'gauge'))).toEqual(['latency_ms: metric names should not contain abbreviated units']);
    expect(texts(fam('things_count', 'gauge'))).toEqual(['things_count: non-histogram and non-summary metrics should not have "_count" suffix']);
    expect(texts(fam('odd_bucket', 'gauge', 'odd_bucket{le="1"} 1'))).toEqual([
      'odd_bucket: non-histogram metrics should not have "_bucket" suffix',
      'odd_bucket: non-histogram metrics should not have "le" label',
    ]);
    expect(texts(fam('job_gauge', 'gauge'))).toEqual(["job_gauge: metric name should not include type 'gauge'"]);
    expect(texts(fam('vllm:num_requests_running', 'gauge'))).toEqual(["vllm:num_requests_running: metric names should not contain ':'"]);
    expect(texts(fam('vllm:num_requests_running', 'gauge'), (n) => n.startsWith('vllm:'))).toEqual([]);
    expect(texts(fam('requestCount', 'gauge', 'requestCount{modelName="x"} 1'))).toEqual([
      "requestCount: metric names should be written in 'snake_case' not 'camelCase'",
      "requestCount: label names should be written in 'snake_case' not 'camelCase'",
    ]);
  });

  it('lists series by name and sorted labels', () => {
    expect(seriesOf(fam('a_total', 'counter', 'a_total{z="1",b="x\\"y"} 2'))).toEqual(['a_total{b=x\\"y,z=1}']);
  });
});
