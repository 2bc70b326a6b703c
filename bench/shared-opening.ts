import { benchArgs, chatBenchEnv, chatStream, fmt, machine, median, startSide, storyText, wholeFlag } from './lib.js';

// A second request that opens like one still running (kept prompts, runtime/kept-prompts.ts): an
// app asks a long question about a document and, while that answer streams, a short one about the
// same document. The second one's time to first token is what this measures, against two daemon
// settings whose pairs alternate. Each pair's document opens with a numbered line, so no daemon
// holds it from a pair before: the second request can start only from the first, still running.
// Usage: node dist/bench/shared-opening.js --model ID --models-dir DIR --a-root DIR | --a 'K=V' [--b 'K=V']
//   [--words 200] [--long-tokens 200] [--pairs 7]

const args = benchArgs();
const model = args.get('model') ?? 'cloudgate/stories260k';
const words = wholeFlag(args, 'words', 200, 1);
const longTokens = wholeFlag(args, 'long-tokens', 200, 1);
const pairs = wholeFlag(args, 'pairs', 7, 1);
const documentOf = (pair: number) => `Document ${pair}. ${storyText(words)}`;
const start = (side: 'a' | 'b') => startSide(args, side, chatBenchEnv(args));

/** The long request, and once its first token is out the short one: the short one's time to first token. */
async function pair(url: string, key: string, doc: string): Promise<number> {
  let started!: () => void;
  const firstToken = new Promise<void>((r) => (started = r));
  const long = chatStream(url, key, 'Tell me everything about it.', { model, maxTokens: longTokens, firstToken: true, system: doc, onToken: () => started() });
  await firstToken;
  const short = await chatStream(url, key, 'Who is in it?', { model, maxTokens: 16, firstToken: false, system: doc });
  await long;
  return short.ttft;
}

async function main() {
  const a = await start('a');
  const b = await start('b');
  try {
    const url = (s: typeof a) => `${s.d.inferenceUrl}/v1/chat/completions`;
    console.log(`machine: ${machine()}\nmodel ${model}: ${pairs} pairs; a ${words}-word document, a ${longTokens}-token answer and, once it streams, a short question on the same document; order alternating\nA: ${a.label}\nB: ${b.label}`);
    await pair(url(a), a.key, documentOf(-1));
    await pair(url(b), b.key, documentOf(-2));
    const ttft = { a: [] as number[], b: [] as number[] };
    for (let p = 0; p < pairs; p++) {
      for (const side of p % 2 ? (['b', 'a'] as const) : (['a', 'b'] as const)) {
        const s = side === 'a' ? a : b;
        ttft[side].push(await pair(url(s), s.key, documentOf(p)));
      }
    }
    const ratios = ttft.a.map((x, p) => ttft.b[p]! / x);
    console.log(`the short question's TTFT ms: A ${fmt(median(ttft.a), 1)}, B ${fmt(median(ttft.b), 1)}; B / A ${fmt(median(ratios), 3)} (B faster in ${ratios.filter((x) => x < 1).length} of ${pairs})`);
  } finally {
    await Promise.all([a.stop(), b.stop()]);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
