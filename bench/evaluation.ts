import path from 'node:path';
import { benchArgs, fmt, machine, median, startSide, type Side } from './lib.js';

// Evaluation latency: 1, 8 and 64 questions against one state of about 400
// tokens in one request, and 64 concurrent single-question requests on it.
// usage.inputTokens shows the state is processed once per request.
// Each request is on a state the daemon has not seen (a numbered opening line before the same
// story), since a state asked about before is kept (EVAL_PREFIX_CACHE_MB) and not prefilled
// again; the row "again" is one question on the state of the request just before it.
// Usage: node dist/bench/evaluation.js [--model ID] [--models-dir DIR] [--dtype q4]
// (--dtype: the weight variant, MODEL_DTYPE, where the model's folder holds it)
// With --b K=V[,K=V] (and --a likewise): two daemons up at once, each request sent to both in
// turn, the order alternating, so each pair shares the machine's minute (this VM's speed moves
// 20 % between runs); prints each size's B / A ratio per pair (e.g. --a MODEL_DTYPE=fp32 --b
// MODEL_DTYPE=q4: is every request faster on 4-bit weights); --a-root / --b-root DIR: the
// checkout (built) a side runs, this one by default.

const args = benchArgs();
const model = args.get('model') ?? 'cloudgate/stories260k-eval';
const REPS = Number(args.get('reps') ?? 9);
const SIZES = [1, 8, 64];
/** 64 concurrent single-question requests this many times a side (after two warm-up bursts). */
const BURSTS = Number(args.get('bursts') ?? 1);

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
/** A state of ~390 tokens no request before has sent: `tag` opens it. */
const stateOf = (tag: string) => `Story ${tag}. ${STATE.repeat(2)}`;
/** Sizes' keys in the figures: 0 the concurrent burst, AGAIN one question on the state asked about just before. */
const AGAIN = -1;

async function start(side: 'a' | 'b', label: string): Promise<Side> {
  const env: Record<string, string> = {};
  if (args.get('models-dir')) env.MODELS_DIR = args.get('models-dir')!;
  if (args.get('dtype')) env.MODEL_DTYPE = args.get('dtype')!;
  const s = await startSide(args, side, env);
  return { ...s, label: `${label}${args.has(`${side}-root`) ? ` @ ${path.resolve(args.get(`${side}-root`)!)}` : ''}` };
}

async function ask(s: Side, n: number, state: string): Promise<{ ms: number; inputTokens: number }> {
  const t0 = performance.now();
  const r = await fetch(`${s.d.inferenceUrl}/api/v1/evaluations`, {
    method: 'POST',
    headers: { authorization: `Bearer ${s.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, state, questions: questions(n) }),
  });
  const body = (await r.json()) as any;
  if (r.status !== 200) throw new Error(`${r.status} ${JSON.stringify(body)}`);
  return { ms: performance.now() - t0, inputTokens: body.usage.inputTokens as number };
}

async function burst(s: Side, state: string): Promise<{ ms: number; inputTokens: number }> {
  const t0 = performance.now();
  const conc = await Promise.all(Array.from({ length: 64 }, () => ask(s, 1, state)));
  return { ms: performance.now() - t0, inputTokens: conc[0]!.inputTokens };
}

async function warm(s: Side): Promise<void> {
  await ask(s, 4, stateOf('warm-up'));
  // The first bursts of this size grow onnxruntime's memory arena (three times slower, about
  // 7.5 s, on one machine); two rounds of warm-up measure the steady state.
  for (let w = 0; w < 2; w++) await burst(s, stateOf(`warm-up burst ${w}`));
}

/** Each size's requests (and the bursts), sides in turns, the order alternating by round. */
async function measure(sides: Side[]) {
  const ms = sides.map(() => Object.fromEntries([...SIZES, 0, AGAIN].map((n) => [n, [] as number[]])) as Record<number, number[]>);
  // Per side: two builds may lay a request out differently (the usage is what each ran).
  const tokens = sides.map(() => ({}) as Record<number, number>);
  for (let r = 0; r < REPS; r++) {
    const order = r % 2 ? [...sides.keys()].reverse() : [...sides.keys()];
    for (const n of [...SIZES, AGAIN]) {
      // A fresh state each (both sides the same one); AGAIN: the one-question request's state again.
      const state = stateOf(`${r}-${n === AGAIN ? 1 : n}`);
      for (const i of order) {
        const x = await ask(sides[i]!, n === AGAIN ? 1 : n, state);
        ms[i]![n]!.push(x.ms);
        tokens[i]![n] = x.inputTokens;
      }
    }
  }
  for (let r = 0; r < BURSTS; r++) {
    for (const i of r % 2 ? [...sides.keys()].reverse() : [...sides.keys()]) {
      const x = await burst(sides[i]!, stateOf(`burst ${r}`));
      ms[i]![0]!.push(x.ms);
      tokens[i]![0] = x.inputTokens;
    }
  }
  return { ms, tokens };
}

async function main() {
  const two = args.has('b') || args.has('b-root');
  const sides = [await start('a', two ? `A (${args.get('a') ?? 'defaults'})` : 'cloudgate')];
  try {
    if (two) sides.push(await start('b', `B (${args.get('b') ?? 'defaults'})`));
    for (const s of sides) await warm(s);
    console.log(`machine: ${machine()}\nmodel: ${model}${args.get('dtype') ? ` (MODEL_DTYPE ${args.get('dtype')})` : ''}; medians of ${REPS} requests${two ? ', A and B in turns' : ''}`);
    const { ms, tokens } = await measure(sides);
    for (const [i, s] of sides.entries()) {
      if (two) console.log(s.label);
      for (const n of SIZES) console.log(`${String(n).padStart(2)} question(s) in one request: median ${fmt(median(ms[i]![n]!), 1)} ms; usage.inputTokens ${tokens[i]![n]}`);
      console.log(`64 concurrent single-question requests: wall ${ms[i]![0]!.map((x) => fmt(x, 1)).join(' / ')} ms, each usage.inputTokens ${tokens[i]![0]} (64 x ${tokens[i]![0]} = ${64 * tokens[i]![0]!} tokens in all)`);
      console.log(`ratio 64 questions / 1 question: ${fmt(median(ms[i]![64]!) / median(ms[i]![1]!), 2)}x (target <= 3x)`);
      console.log(`again: 1 question on the state asked about just before: median ${fmt(median(ms[i]![AGAIN]!), 1)} ms (${fmt(median(ms[i]![AGAIN]!) / median(ms[i]![1]!), 3)} of a fresh state's); usage.inputTokens ${tokens[i]![AGAIN]}`);
    }
    if (two) {
      for (const n of [...SIZES, 0, AGAIN]) {
        const ratios = ms[1]![n]!.map((b, k) => b / ms[0]![n]![k]!);
        const what = n === AGAIN ? '1 question, again' : n ? `${n} question(s)` : '64 concurrent requests';
        console.log(`B / A, ${what}: median ${fmt(median(ratios), 3)}, B faster in ${ratios.filter((x) => x < 1).length} of ${ratios.length} pairs`);
      }
    }
  } finally {
    for (const s of sides) await s.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
