import { benchArgs, chatBenchEnv, chatStream, fmt, machine, median, startSide, storyText, wholeFlag } from './lib.js';

// A conversation's turns against two daemon settings (kept prompts, runtime/kept-prompts.ts):
// each turn sends the whole conversation again (a system prompt, then every user message and
// answer so far), as chat clients do, and the time to its first token is what the user waits.
// Both daemons run at once; each pair of conversations (one on A, one on B, order alternating)
// shares the machine's minute. Each pair's conversation opens with a numbered line, so no
// daemon holds it from a pair before; within a conversation, a daemon that keeps prompts starts
// each turn from the last. Greedy: the bench says where the two daemons' answers differed.
// Usage: node dist/bench/chat-turns.js --model ID --models-dir DIR [--a 'CHAT_PREFIX_CACHE_MB=0'] [--b 'K=V']
//   [--turns 6] [--system-words 200] [--tokens 32] [--pairs 5]

const args = benchArgs();
const model = args.get('model') ?? 'cloudgate/stories260k';
const turns = wholeFlag(args, 'turns', 6, 1);
const systemWords = wholeFlag(args, 'system-words', 200, 1);
const maxTokens = wholeFlag(args, 'tokens', 32, 1);
const pairs = wholeFlag(args, 'pairs', 5, 1);
const system = (pair: number) => `Conversation ${pair}. ${storyText(systemWords)}`;

type Message = { role: 'system' | 'user' | 'assistant'; content: string };

const start = (side: 'a' | 'b') => startSide(args, side, chatBenchEnv(args));

/** One streamed greedy turn: its time to first text, the answer, and the prompt's size. */
async function turn(url: string, key: string, messages: Message[]): Promise<{ ttftMs: number; text: string; promptTokens: number }> {
  let text = '';
  const r = await chatStream(url, key, '', { model, maxTokens, firstToken: false, messages, onContent: (t) => (text += t) });
  return { ttftMs: r.ttft, text, promptTokens: r.promptTokens };
}

/** A whole conversation: each turn's time to first text, answer and prompt size. */
async function conversation(url: string, key: string, pair: number) {
  const messages: Message[] = [{ role: 'system', content: system(pair) }];
  const out: Array<{ ttftMs: number; text: string; promptTokens: number }> = [];
  for (let t = 0; t < turns; t++) {
    messages.push({ role: 'user', content: `Tell me what happened next, part ${t + 1}.` });
    const r = await turn(url, key, messages);
    out.push(r);
    messages.push({ role: 'assistant', content: r.text });
  }
  return out;
}

async function main() {
  const a = await start('a');
  const b = await start('b');
  try {
    const url = (s: typeof a) => `${s.d.inferenceUrl}/v1/chat/completions`;
    console.log(`machine: ${machine()}\nmodel ${model}: ${pairs} pairs of conversations of ${turns} turns (a ${systemWords}-word system prompt, ${maxTokens} tokens an answer), order alternating\nA: ${a.label}\nB: ${b.label}`);
    // One conversation each first, not counted: threads wake, the JIT warms.
    await conversation(url(a), a.key, -1);
    await conversation(url(b), b.key, -2);
    const ttft = { a: [] as number[][], b: [] as number[][] };
    const whole = { a: [] as number[], b: [] as number[] };
    let prompts: number[] = [];
    const firstDiffering: number[] = [];
    for (let p = 0; p < pairs; p++) {
      const got: Record<'a' | 'b', Awaited<ReturnType<typeof conversation>>> = { a: [], b: [] };
      for (const side of p % 2 ? (['b', 'a'] as const) : (['a', 'b'] as const)) {
        const s = side === 'a' ? a : b;
        const t0 = performance.now();
        got[side] = await conversation(url(s), s.key, p);
        whole[side].push(performance.now() - t0);
        ttft[side].push(got[side].map((r) => r.ttftMs));
      }
      // The first turn whose answers differ: from there on the two conversations are not the same one.
      const differs = got.a.findIndex((r, t) => r.text !== got.b[t]!.text);
      if (differs >= 0) firstDiffering.push(differs + 1);
      prompts = got.a.map((r) => r.promptTokens);
    }
    console.log('| turn | prompt tokens | TTFT ms A | TTFT ms B | B / A (pairs B faster) |');
    console.log('| --- | --- | --- | --- | --- |');
    for (let t = 0; t < turns; t++) {
      const ratios = ttft.a.map((row, p) => ttft.b[p]![t]! / row[t]!);
      console.log(`| ${t + 1} | ${prompts[t]} | ${fmt(median(ttft.a.map((r) => r[t]!)), 1)} | ${fmt(median(ttft.b.map((r) => r[t]!)), 1)} | ${fmt(median(ratios), 3)} (${ratios.filter((x) => x < 1).length} of ${pairs}) |`);
    }
    const wholeRatios = whole.a.map((x, p) => whole.b[p]! / x);
    console.log(`whole conversation ms: A ${fmt(median(whole.a))}, B ${fmt(median(whole.b))}, B / A ${fmt(median(wholeRatios), 3)} (${wholeRatios.filter((x) => x < 1).length} of ${pairs})`);
    console.log(firstDiffering.length ? `answers differed in ${firstDiffering.length} of ${pairs} pairs, first at turns ${firstDiffering.join(', ')} (greedy, but not the same arithmetic: see bench/README.md "Kept prompts")` : 'answers identical on both, turn by turn');
  } finally {
    await Promise.all([a.stop(), b.stop()]);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
