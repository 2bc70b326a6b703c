import { benchArgs, chatBenchEnv, daemonProbe, exchangeSides, fmt, machine, ownSummary, pairRatios, pairSummary, PHASE_SECONDS_MIN, sideCancelled, secondsFlag, startSide, storyText, streamPhase, wholeFlag, wholeListFlag, type OwnView } from './lib.js';

// Two daemon settings against each other on a machine whose speed drifts (this 2-core VM's
// one-stream rate moved 350-700 tokens/s from one minute to the next): both daemons run at
// once, and short phases of streaming alternate between them, so each pair of phases shares
// the machine's minute. Prints each pair's B / A ratio, how many pairs B won, their median
// and geometric mean.
// --model A,B: several models of the daemon at once, N streams each (models sharing the cores,
// runtime/peers.ts): a phase's rate is their sum, its TTFT their median's mean.
// Usage: node dist/bench/ab.js --model ID[,ID2...] --models-dir DIR [--a 'K=V,K=V'] [--b 'K=V'] [--a-root DIR] [--b-root DIR]
//   [--streams 1] [--rounds 20] [--seconds 2] [--tokens 64] [--ttft first-token] [--system-words N] [--long-prompt-words N[,N2...] --long-tokens M --long-streams K]
//   [--first-streams N] [--both-sides]
// --both-sides: the pairs run twice, on fresh daemons each time, the second time with A's and B's
// settings (and checkouts) exchanged, and the end line gives B's settings against A's with the
// side cancelled (the square root of the first B / A over the second) and the lean of being the
// second daemon (the square root of their product): on the 2-core VMs the second daemon has read
// 1.01-1.10 faster than the first with both alike (bench/README.md "A token post on a Zen 5").
// --first-streams N: each daemon streams at N clients for a few seconds before the pairs. More
// clients than batch slots (64) want it: a fresh daemon has seen no request end and judges a
// queue past its free slots by its warm-up's one-row pace, which is cautious, and may refuse
// some of it (docs/faults.md "Overload").
// --long-prompt-words: K streams more (default 1), whose prompt is a story of N words (stream i the i-th
// of several lengths, in turn) and which generate M tokens (default 256) each request: long
// conversations beside the short ones (KV_SPLIT_LONG_ROWS).
// --a / --b: environment of each daemon (DAEMON_NODE_ARGS there: its node flags, test/daemon.ts daemonNodeArgs);
// --a-root / --b-root: the checkout each runs (built), this one by default.
// Under the pairs, each daemon's own view of its phases (lib.ts daemonProbe): the engine's time to first token
// from admission, and the HTTP thread's CPU a token.

const args = benchArgs();
const model = args.get('model') ?? 'cloudgate/stories260k';
const streams = wholeFlag(args, 'streams', 1, 1);
const rounds = wholeFlag(args, 'rounds', 20, 1);
const seconds = secondsFlag(args, 'seconds', 2, PHASE_SECONDS_MIN);
/** Streaming on a daemon before its phase is timed: its threads wake and its caches fill. */
const WARM_SECONDS = 0.3;
const models = model.split(',');
const firstStreams = wholeFlag(args, 'first-streams', 0, 0);
/** The --first-streams phase: long enough for several requests of every client to end. */
const FIRST_SECONDS = 3;
const longWords = wholeListFlag(args, 'long-prompt-words', 0, 0);
const systemWords = wholeFlag(args, 'system-words', 0, 0);
const bothSides = args.has('both-sides');
const opts = {
  maxTokens: wholeFlag(args, 'tokens', 64, 1),
  firstToken: args.get('ttft') === 'first-token',
  // --system-words N: every request opens with the same system prompt of N words (an app's instructions), from the one key.
  ...(systemWords ? { system: storyText(systemWords) } : {}),
};
const long = longWords.some((w) => w > 0) ? { prompts: longWords.map((w) => storyText(w)), maxTokens: wholeFlag(args, 'long-tokens', 256, 1), streams: wholeFlag(args, 'long-streams', 1, 1) } : undefined;

/** One run of the pairs on two fresh daemons (`sides` says what each runs); B / A's median and geometric mean. */
async function pairs(sides: Map<string, string>): Promise<{ median: number; geo: number }> {
  const start = (side: 'a' | 'b') => startSide(sides, side, chatBenchEnv(args));
  const a = await start('a');
  const b = await start('b');
  try {
    const url = (s: typeof a) => `${s.d.inferenceUrl}/v1/chat/completions`;
    console.log(`machine: ${machine()}\nmodel ${model}, ${streams} stream(s)${models.length > 1 ? ' each' : ''}${systemWords ? `, a ${systemWords}-word system prompt on every request` : ''}${long ? ` and ${long.streams} of a ${longWords.join(' / ')}-word prompt generating ${long.maxTokens} tokens` : ''}, ${rounds} pairs of ${seconds} s phases (order alternating)\nA: ${a.label}\nB: ${b.label}`);
    if (firstStreams) for (const s of [a, b]) await Promise.all(models.map((m) => streamPhase(url(s), s.key, firstStreams, FIRST_SECONDS, { ...opts, model: m })));
    const res = { a: [] as Array<{ rate: number; ttftMs: number }>, b: [] as Array<{ rate: number; ttftMs: number }> };
    const own = { a: [] as OwnView[], b: [] as OwnView[] };
    for (let r = 0; r < rounds; r++) {
      for (const side of r % 2 ? (['b', 'a'] as const) : (['a', 'b'] as const)) {
        const s = side === 'a' ? a : b;
        const phase = (secs: number, lng?: typeof long) => Promise.all(models.map((m) => streamPhase(url(s), s.key, streams, secs, { ...opts, model: m }, lng)));
        await phase(WARM_SECONDS);
        const probed = await daemonProbe(s.d);
        const each = await phase(seconds, long);
        res[side].push({ rate: each.reduce((n, p) => n + p.rate, 0), ttftMs: each.reduce((n, p) => n + p.ttftMs, 0) / each.length });
        own[side].push(await probed(each.reduce((n, p) => n + p.tokens, 0)));
      }
    }
    console.log(pairSummary({ label: 'A', phases: res.a }, { label: 'B', phases: res.b }));
    console.log(`${ownSummary(own.a, 'A')}\n${ownSummary(own.b, 'B')}`);
    return pairRatios(res.a, res.b);
  } finally {
    await Promise.all([a.stop(), b.stop()]);
  }
}

async function main() {
  const straight = await pairs(args);
  if (!bothSides) return;
  console.log("\n--both-sides: the pairs again on fresh daemons, B's settings on the first daemon (A) and A's on the second (B):");
  const back = await pairs(exchangeSides(args));
  // In the second run B / A is A's settings over B's.
  const [med, geo] = [sideCancelled(straight.median, back.median), sideCancelled(straight.geo, back.geo)];
  console.log(`with the side cancelled, B's settings / A's: ${fmt(med.settings, 3)} from the medians, ${fmt(geo.settings, 3)} from the geometric means; the second daemon's own lean ${fmt(med.lean, 3)} (${fmt(geo.lean, 3)})`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
