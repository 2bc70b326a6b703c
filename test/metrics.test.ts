import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { lintMetrics, seriesOf } from '../src/metrics-lint.js';
import { call, daemon, fund, newUser } from './helpers.js';

// What a Prometheus scraping both ports sees: each figure once, promtool-clean
// names, and the engine under vLLM's names.

const CHAT = 'cloudgate/random-llama-chat';
const scrape = async (port: 'platform' | 'inference') => {
  const r = await call(port, 'GET', '/metrics', { key: null });
  expect(r.status).toBe(200);
  return r.body as string;
};
const value = (text: string, name: string, labels: string[] = []): number =>
  text
    .split('\n')
    .filter((l) => (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && labels.every((x) => l.includes(x)))
    .reduce((s, l) => s + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);

describe('metrics', () => {
  it('serves no series on both ports, and each port counts its own requests', async () => {
    await call('platform', 'GET', '/healthz');
    await call('inference', 'GET', '/healthz');
    const [p, i] = await Promise.all([scrape('platform'), scrape('inference')]);
    const onPlatform = new Set(seriesOf(p));
    const both = seriesOf(i).filter((s) => onPlatform.has(s));
    expect(both).toEqual([]);
    expect(p).toMatch(/http_requests_total\{server="platform",route="\/healthz",method="GET",status="200"\} \d+/);
    expect(p).not.toContain('server="inference"');
    expect(i).toMatch(/http_requests_total\{server="inference",route="\/healthz",method="GET",status="200"\} \d+/);
    expect(i).not.toContain('server="platform"');
    // Process figures once, on the platform port.
    expect(p).toContain('process_cpu_user_seconds_total');
    expect(i).not.toContain('process_cpu_user_seconds_total');
    expect(value(p, 'cloudgate_build_info', ['server="platform"'])).toBe(1);
    expect(value(i, 'cloudgate_build_info', ['server="inference"'])).toBe(1);
    // Where each model runs, one series a model.
    expect(value(i, 'cloudgate_engine_model_info', [`model_name="${CHAT}"`, 'provider="cpu"', 'dtype="fp32"'])).toBe(1);
    expect(value(i, 'cloudgate_engine_model_info', [`model_name="${CHAT}"`])).toBe(1);
  });

  it('passes promtool\'s lint rules (vLLM\'s colon names on the inference port the one exemption)', async () => {
    const [p, i] = await Promise.all([scrape('platform'), scrape('inference')]);
    expect(lintMetrics(p)).toEqual([]);
    expect(lintMetrics(i, (n) => n.startsWith('vllm:'))).toEqual([]);
    // The exemption is only that: a vllm: family breaks no other rule.
    expect(lintMetrics(i).every((x) => x.metric.startsWith('vllm:') && x.text === "metric names should not contain ':'")).toBe(true);
  });

  it('reports a generation under vLLM names with model_name: tokens, phases, finish reason, KV usage as a fraction', async () => {
    const u = await newUser(['inference:use']);
    await fund(u.userId, 1_000_000);
    const before = await scrape('inference');
    const openai = new OpenAI({ baseURL: `${daemon().inferenceUrl}/api/v1`, apiKey: u.key, maxRetries: 0 });
    const r = await openai.chat.completions.create({ model: CHAT, messages: [{ role: 'user', content: 'hello metrics' }], max_tokens: 6, temperature: 0 });
    const after = await scrape('inference');
    const m = `model_name="${CHAT}"`;
    const d = (name: string, labels: string[] = []) => value(after, name, [m, ...labels]) - value(before, name, [m, ...labels]);
    expect(d('vllm:prompt_tokens_total')).toBeGreaterThanOrEqual(r.usage!.prompt_tokens);
    expect(d('vllm:generation_tokens_total')).toBeGreaterThanOrEqual(r.usage!.completion_tokens);
    const reason = r.choices[0]!.finish_reason;
    expect(d('vllm:request_success_total', [`finished_reason="${reason}"`])).toBeGreaterThanOrEqual(1);
    for (const h of ['e2e_request_latency', 'request_queue_time', 'request_prefill_time', 'request_decode_time', 'time_to_first_token', 'request_inference_time']) {
      expect(d(`vllm:${h}_seconds_count`), h).toBeGreaterThanOrEqual(1);
    }
    expect(d('vllm:request_prompt_tokens_count')).toBeGreaterThanOrEqual(1);
    expect(d('vllm:request_prompt_tokens_sum')).toBeGreaterThanOrEqual(r.usage!.prompt_tokens);
    expect(d('vllm:request_generation_tokens_sum')).toBeGreaterThanOrEqual(r.usage!.completion_tokens);
    // Buckets reach streams of minutes: the top finite bucket of a request duration is 20 minutes.
    expect(after).toContain(`vllm:e2e_request_latency_seconds_bucket{le="1200",${m}}`);
    for (const g of ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc', 'vllm:num_requests_running', 'vllm:num_requests_waiting']) {
      expect(after).toMatch(new RegExp(`^${g}\\{${m.replace(/[/.]/g, '\\$&')}\\} `, 'm'));
    }
    const kv = value(after, 'vllm:kv_cache_usage_perc', [m]);
    expect(kv).toBeGreaterThanOrEqual(0);
    expect(kv).toBeLessThanOrEqual(1);
    expect(value(after, 'vllm:gpu_cache_usage_perc', [m])).toBe(kv);
  });

  it('shows a live stream as running with KV held, and counts it as abort when its client leaves', async () => {
    const u = await newUser(['inference:use']);
    await fund(u.userId, 1_000_000);
    const openai = new OpenAI({ baseURL: `${daemon().inferenceUrl}/api/v1`, apiKey: u.key, maxRetries: 0 });
    const m = `model_name="${CHAT}"`;
    const s = await openai.chat.completions.create({ model: CHAT, messages: [{ role: 'user', content: 'a long story please' }], max_tokens: 400, temperature: 0, stream: true });
    let n = 0;
    let during = '';
    for await (const _ of s) {
      if (++n === 3) {
        during = await scrape('inference');
        break;
      }
    }
    expect(value(during, 'vllm:num_requests_running', [m])).toBeGreaterThanOrEqual(1);
    // At least this stream's prompt is held: more than nothing, at most everything.
    const kv = value(during, 'vllm:kv_cache_usage_perc', [m]);
    expect(kv).toBeGreaterThan(0);
    expect(kv).toBeLessThanOrEqual(1);
    // Leaving the stream cancels it: a finished request with reason abort (other files share the daemon: poll for ours).
    const aborts = (t: string) => value(t, 'vllm:request_success_total', [m, 'finished_reason="abort"']);
    const before = aborts(during);
    let now = before;
    for (let i = 0; i < 50 && now <= before; i++) {
      await new Promise((r) => setTimeout(r, 50));
      now = aborts(await scrape('inference'));
    }
    expect(now).toBeGreaterThan(before);
  });
});
