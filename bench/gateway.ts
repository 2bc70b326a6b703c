import { startDaemon, stopDaemon } from '../test/daemon.js';
import { benchKey, fmt, latencyC1, load, machine, startBare, sweep } from './lib.js';

// Gateway overhead: an authenticated GET through the daemon against a bare
// uWS server answering the same bytes, in one run on one machine.
// Usage: node dist/bench/gateway.js [--path /api/v1/models] [--port inference|platform] [--seconds 5]

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i]!.replace(/^--/, ''), process.argv[i + 1]!);
const target = args.get('port') ?? 'platform';
const routePath = args.get('path') ?? (target === 'platform' ? '/api/v1/user/teams' : '/api/v1/models');
const seconds = Number(args.get('seconds') ?? 5);
const P99_MS_MAX = 10; // the latency bound the throughput figure is quoted at

async function main() {
  const d = await startDaemon(); // production settings: info logs, one line per request
  try {
    const key = await benchKey(d, ['teams:read', 'instances:read', 'inference:use', 'billing:read']);
    const headers = { authorization: `Bearer ${key}` };
    const url = (target === 'platform' ? d.platformUrl : d.inferenceUrl) + routePath;
    const first = await fetch(url, { headers });
    const body = await first.text();
    if (first.status !== 200) throw new Error(`${routePath} answered ${first.status}: ${body}`);
    const bare = await startBare(body, first.headers.get('content-type') ?? 'application/json');
    try {
      // warm both
      await load(url, headers, 4, 1);
      await load(bare.url, headers, 4, 1);
      const n = Math.max(2000, seconds * 2000);
      const gw1 = await latencyC1(url, headers, n);
      const bare1 = await latencyC1(bare.url, headers, n);
      const gw = await sweep(url, headers, seconds, P99_MS_MAX);
      const bs = await sweep(bare.url, headers, seconds, P99_MS_MAX);
      const lines = [
        `machine: ${machine()}`,
        `route: GET ${routePath} on the ${target} port (${body.length} bytes), authenticated`,
        `concurrency 1 (${n} sequential requests): gateway p50 ${fmt(gw1.p50Us)} us p99 ${fmt(gw1.p99Us)} us | bare p50 ${fmt(bare1.p50Us)} us p99 ${fmt(bare1.p99Us)} us | added p99 ${fmt((gw1.p99Us - bare1.p99Us) / 1000, 3)} ms`,
        ...gw.runs.map((r) => `  gateway c=${r.connections}: ${fmt(r.rps)} req/s p50 ${r.p50} p99 ${r.p99} ms errors ${r.errors} non2xx ${r.non2xx}`),
        ...bs.runs.map((r) => `  bare    c=${r.connections}: ${fmt(r.rps)} req/s p50 ${r.p50} p99 ${r.p99} ms`),
        `best at p99 <= ${P99_MS_MAX} ms: gateway ${fmt(gw.best?.rps ?? 0)} req/s (c=${gw.best?.connections}), bare ${fmt(bs.best?.rps ?? 0)} req/s (c=${bs.best?.connections}), ratio ${fmt((gw.best?.rps ?? 0) / (bs.best?.rps ?? 1), 2)}`,
      ];
      console.log(lines.join('\n'));
    } finally {
      bare.proc.kill();
    }
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
