import { counter, gauge, histogram } from '../../metrics.js';

// The engine's Prometheus series (per model). Names and labels are shared with
// any other engine build loaded in the same process (get-or-create).

export const engineMetrics = {
  ttft: histogram({
    name: 'engine_time_to_first_token_seconds',
    help: 'From admission to the first generated token',
    labelNames: ['model'],
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
  }),
  itl: histogram({
    name: 'engine_inter_token_latency_seconds',
    help: 'Time between consecutive generated tokens of a sequence',
    labelNames: ['model'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
  }),
  promptTokens: counter({ name: 'engine_prompt_tokens_total', help: 'Prompt tokens run through the model (prefill; evaluation prefixes and branches)', labelNames: ['model'] }),
  generatedTokens: counter({ name: 'engine_generated_tokens_total', help: 'Tokens generated', labelNames: ['model'] }),
  running: gauge({ name: 'engine_running_sequences', help: 'Sequences (and evaluation jobs) holding a batch slot', labelNames: ['model'] }),
  waiting: gauge({ name: 'engine_waiting_sequences', help: 'Requests waiting for a batch slot', labelNames: ['model'] }),
  batchSize: histogram({
    name: 'engine_batch_size',
    help: 'Rows in one forward pass',
    labelNames: ['model', 'phase'],
    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
  }),
  kvBytes: gauge({ name: 'engine_kv_cache_bytes', help: 'Bytes held by the KV caches of live sequences (resident batch and detached)', labelNames: ['model'] }),
};
