import { startDaemon, stopDaemon } from '../test/daemon.js';
import { benchArgs, benchKey, fmt, machine } from './lib.js';

// Evaluation latency: 1, 8 and 64 questions against one state of about 400
// tokens in one request, and 64 concurrent single-question requests on it.
// usage.inputTokens shows the state is processed once per request.
// Usage: node dist/bench/evaluation.js [--model ID] [--models-dir DIR] [--dtype q4]
// (--dtype: the weight variant, MODEL_DTYPE, where the model's folder holds it)

const args = benchArgs();
const model = args.get('model') ?? 'cloudgate/stories260k-eval';
const REPS = 9;

const STATE =
  'Lily was a little girl who loved to play in the park. One day she saw a big red ball under a tree. She ran to the ball and kicked it high into the sky. ' +
  'Her friend Tom laughed and clapped his hands. They played together until the sun went down, and then they walked home, tired and happy. ';

// Short yes/no questions about the story, as a grader would ask them.
const SUBJECTS = ['Lily', 'Tom', 'the ball', 'the tree', 'the park', 'the sun', 'the sky', 'the girl'];
const TRAITS = ['happy', 'sad', 'red', 'big', 'tired', 'little', 'loud', 'kind'];
const questions = (n: number) =>
  Object.fromEntries(
    Array.from({ length: n }, (_, i) => [`q${i}`, { type: 'boolean', instructions: `Is ${SUBJECTS[i % 8]} ${TRAITS[Math.floor(i / 8) % 8]}?` }]),
  );

async function main() {
  const env: Record<string, string> = {};
  if (args.get('models-dir')) env.MODELS_DIR = args.get('models-dir')!;
  if (args.get('dtype')) env.MODEL_DTYPE = args.get('dtype')!;
  const d = await startDaemon(env);
  try {
    const key = await benchKey(d, ['inference:use'], 1_000_000_000);
    const ask = async (state: string, n: number) => {
      const t0 = performance.now();
      const r = await fetch(`${d.inferenceUrl}/api/v1/evaluations`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, state, questions: questions(n) }),
      });
      const body = (await r.json()) as any;
      if (r.status !== 200) throw new Error(`${r.status} ${JSON.stringify(body)}`);
      return { ms: performance.now() - t0, inputTokens: body.usage.inputTokens as number };
    };
    const state = STATE.repeat(2);
    await ask(state, 4); // warm-up
    console.log(`machine: ${machine()}\nmodel: ${model}${args.get('dtype') ? ` (MODEL_DTYPE ${args.get('dtype')})` : ''}`);
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
    const results: Record<number, number> = {};
    for (const n of [1, 8, 64]) {
      const runs = [];
      for (let r = 0; r < REPS; r++) runs.push(await ask(state, n));
      results[n] = median(runs.map((x) => x.ms));
      console.log(`${String(n).padStart(2)} question(s) in one request: median ${fmt(results[n]!, 1)} ms; usage.inputTokens ${runs[0]!.inputTokens}`);
    }
    // The first bursts of this size grow onnxruntime's memory arena (three times slower, about
    // 7.5 s, on this machine); two rounds of warm-up measure the steady state.
    for (let w = 0; w < 2; w++) await Promise.all(Array.from({ length: 64 }, () => ask(state, 1)));
    const t0 = performance.now();
    const conc = await Promise.all(Array.from({ length: 64 }, () => ask(state, 1)));
    const wall = performance.now() - t0;
    const tokens1 = conc[0]!.inputTokens;
    console.log(`64 concurrent single-question requests: wall ${fmt(wall, 1)} ms, each usage.inputTokens ${tokens1} (64 x ${tokens1} = ${64 * tokens1} tokens in all)`);
    console.log(`ratio 64 questions / 1 question: ${fmt(results[64]! / results[1]!, 2)}x (target <= 3x)`);
  } finally {
    await stopDaemon(d);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
