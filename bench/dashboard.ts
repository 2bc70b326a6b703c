import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { repoRoot, startDaemon, stopDaemon } from '../test/daemon.js';
import { benchKey, machine } from './lib.js';

// Does every panel of deploy/grafana/cloudgate.json have data? Starts Debian's
// Prometheus (apt package `prometheus`, installed here with apt-get when it is
// missing and we are root) scraping both ports of a fresh daemon every second,
// puts a short bounded load on it (chat streams and plain completions, an
// evaluation, platform reads, a rate-limited key), then evaluates each panel's
// queries through Prometheus' HTTP API. Prints `panels with data: N / M`, and
// `promtool check metrics` on each port when promtool is present.
//
//   npm run build && flock /tmp/cloudgate-bench.lock node dist/bench/dashboard.js [--seconds 40]

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i]!.replace(/^--/, ''), process.argv[i + 1] ?? '');
const LOAD_SECONDS = Number(args.get('seconds') ?? 40);
const PROM_PORT = 19_090;
const CHAT = 'cloudgate/random-llama-chat';
const EVAL = 'cloudgate/random-llama-eval';
/** Grafana's $__rate_interval is at least 4 scrape intervals; a minute covers the whole run at 1 s scrapes. */
const RATE_INTERVAL = '1m';

function ensurePrometheus(): void {
  const has = (b: string) => {
    try {
      execFileSync('which', [b], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  };
  if (has('prometheus')) return;
  if (process.getuid?.() !== 0) throw new Error('prometheus is not installed: apt-get install prometheus (as root), then run this again');
  console.log('installing Debian prometheus: apt-get install -y --no-install-recommends prometheus');
  execFileSync('apt-get', ['install', '-y', '--no-install-recommends', 'prometheus'], { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
}

async function post(url: string, key: string, body: unknown): Promise<number> {
  const r = await fetch(url, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  await r.arrayBuffer();
  return r.status;
}

function stream(url: string, key: string, body: unknown, readChunks = Infinity): Promise<void> {
  const u = new URL(url);
  const data = JSON.stringify(body);
  return new Promise((resolve) => {
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      let n = 0;
      res.on('data', () => {
        if (++n >= readChunks) req.destroy(); // a client that leaves: finish reason abort
      });
      res.on('end', resolve);
      res.on('close', resolve);
    });
    req.on('error', () => resolve());
    req.end(data);
  });
}

async function query(expr: string): Promise<number> {
  const r = await fetch(`http://127.0.0.1:${PROM_PORT}/api/v1/query?query=${encodeURIComponent(expr)}`);
  const j = (await r.json()) as { status: string; error?: string; data?: { result: Array<{ value: [number, string] }> } };
  if (j.status !== 'success') throw new Error(`${expr}: ${j.error}`);
  // A panel has data when some series has a finite value (a rate over no traffic is NaN).
  return (j.data?.result ?? []).filter((s) => Number.isFinite(Number(s.value[1]))).length;
}

async function main() {
  ensurePrometheus();
  const d = await startDaemon({ RATE_LIMIT_RPM: '0', RATE_LIMIT_TPM: '0' });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-prom-'));
  const target = (u: string) => new URL(u).host;
  fs.writeFileSync(
    path.join(dir, 'prometheus.yml'),
    [
      'global: { scrape_interval: 1s, evaluation_interval: 1s }',
      'scrape_configs:',
      `  - job_name: cloudgate-platform\n    static_configs: [{ targets: ['${target(d.platformUrl)}'] }]`,
      `  - job_name: cloudgate-inference\n    static_configs: [{ targets: ['${target(d.inferenceUrl)}'] }]`,
      '',
    ].join('\n'),
  );
  const prom = spawn('prometheus', [`--config.file=${dir}/prometheus.yml`, `--storage.tsdb.path=${dir}/data`, `--web.listen-address=127.0.0.1:${PROM_PORT}`], { stdio: ['ignore', 'ignore', fs.openSync(path.join(dir, 'prometheus.log'), 'a')] });
  try {
    const version = execFileSync('prometheus', ['--version']).toString().split('\n')[0];
    console.log(`machine: ${machine()} (shared with other work)\n${version}\nload: ${LOAD_SECONDS} s`);
    const key = await benchKey(d, ['inference:use'], 1_000_000_000);
    const limited = await benchKey(d, ['inference:use'], 1_000_000_000);
    // A key of 1 request a minute: its second request is refused (the refusals panel).
    await fetch(`${d.platformUrl}/api/admin/api-keys/${await keyId(d, limited)}`, { method: 'PATCH', headers: { authorization: `Bearer ${d.adminKey}`, 'content-type': 'application/json' }, body: JSON.stringify({ rateLimits: { requestsPerMinute: 1 } }) }).catch(() => undefined);
    const chatUrl = `${d.inferenceUrl}/api/v1/chat/completions`;
    const until = performance.now() + LOAD_SECONDS * 1000;
    const chat = (over: Record<string, unknown>) => ({ model: CHAT, messages: [{ role: 'user', content: 'Once upon a time' }], temperature: 0, ...over });
    const loops = [
      // 4 long streams, one at a time each: running, KV, decode, inter-token latency.
      ...Array.from({ length: 4 }, () => async () => {
        while (performance.now() < until) await stream(chatUrl, key, chat({ stream: true, max_tokens: 200 }));
      }),
      // Short completions (finish length), early leavers (abort), an evaluation, platform reads.
      async () => {
        for (let i = 0; performance.now() < until; i++) {
          await post(chatUrl, key, chat({ max_tokens: 4 + (i % 8) }));
          if (i % 5 === 0) await stream(chatUrl, key, chat({ stream: true, max_tokens: 200 }), 3);
          if (i % 7 === 0) await post(`${d.inferenceUrl}/api/v1/evaluations`, key, { model: EVAL, state: 'Lily played with a red ball in the park.', questions: { q: { type: 'boolean', instructions: 'Is the ball red?' } } });
          if (i % 3 === 0) await post(chatUrl, limited, chat({ max_tokens: 2 }));
          await fetch(`${d.platformUrl}/healthz`).then((r) => r.arrayBuffer());
        }
      },
    ];
    await Promise.all(loops.map((f) => f()));
    await new Promise((r) => setTimeout(r, 3000)); // two more scrapes
    for (const [name, url] of [['platform', d.platformUrl], ['inference', d.inferenceUrl]] as const) {
      const text = await (await fetch(`${url}/metrics`)).text();
      try {
        execFileSync('promtool', ['check', 'metrics'], { input: text, stdio: ['pipe', 'pipe', 'pipe'] });
        console.log(`promtool check metrics, ${name} port: clean`);
      } catch (e) {
        const err = e as { status?: number; stdout?: Buffer; stderr?: Buffer };
        const lines = `${err.stdout ?? ''}${err.stderr ?? ''}`.trim().split('\n');
        console.log(`promtool check metrics, ${name} port: exit ${err.status}, ${lines.length} lines, e.g. ${lines.slice(0, 3).join(' | ')}`);
      }
    }
    const dash = JSON.parse(fs.readFileSync(path.join(repoRoot, 'deploy/grafana/cloudgate.json'), 'utf8')) as { panels: Array<{ title: string; targets: Array<{ expr: string }> }> };
    let withData = 0;
    for (const p of dash.panels) {
      const counts = await Promise.all(p.targets.map((t) => query(t.expr.replaceAll('$__rate_interval', RATE_INTERVAL).replaceAll('$model_name', CHAT))));
      const ok = counts.some((c) => c > 0);
      if (ok) withData++;
      console.log(`${ok ? 'data   ' : 'NO DATA'} ${p.title} (series per query: ${counts.join(', ')})`);
    }
    console.log(`panels with data: ${withData} / ${dash.panels.length}`);
    if (withData !== dash.panels.length) process.exitCode = 1;
  } finally {
    prom.kill('SIGTERM');
    await stopDaemon(d);
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** The id of the key whose secret is `key` (whoami says which key is calling). */
async function keyId(d: { platformUrl: string }, key: string): Promise<string> {
  const r = (await (await fetch(`${d.platformUrl}/api/v1/user/whoami`, { headers: { authorization: `Bearer ${key}` } })).json()) as { data: { apiKeyId: string } };
  return r.data.apiKeyId;
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
