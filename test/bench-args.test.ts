import { describe, expect, it } from 'vitest';
import { benchArgs, exchangeSides, ownSummary, pairRatios, secondsFlag, sideCancelled, sumAndCount, threadCpuMs, wholeFlag, wholeListFlag } from '../bench/lib.js';
import { daemonNodeArgs } from './daemon.js';

// The benchmarks' argument parser: a bare flag must not swallow the flag after it
// (`--http --streams 16` read as http = '--streams' and a lone '16' dropped the streams).
describe('benchArgs', () => {
  it('reads --name value pairs', () => {
    expect([...benchArgs(['--streams', '16', '--ttft', 'first-token'])]).toEqual([
      ['streams', '16'],
      ['ttft', 'first-token'],
    ]);
  });

  it('reads a bare flag, before another flag or last, as true', () => {
    const a = benchArgs(['--http', '--streams', '16', '--int8-products']);
    expect(a.get('http')).toBe('true');
    expect(a.get('streams')).toBe('16');
    expect(a.get('int8-products')).toBe('true');
  });

  it('refuses a count or a duration that is not one, naming the flag, the rule and the value', () => {
    const a = benchArgs(['--rounds', 'eight', '--streams', '1.5', '--seconds', '0', '--warm-seconds', 'x']);
    expect(() => wholeFlag(a, 'rounds', 8, 1)).toThrow("--rounds: a whole number of at least 1, got 'eight'");
    expect(() => wholeFlag(a, 'streams', 1, 1)).toThrow("--streams: a whole number of at least 1, got '1.5'");
    expect(() => secondsFlag(a, 'seconds', 3, 0.5)).toThrow("--seconds: seconds, at least 0.5, got '0'");
    expect(() => secondsFlag(a, 'warm-seconds', 5, 0)).toThrow("--warm-seconds: seconds, at least 0, got 'x'");
    expect(wholeFlag(a, 'threads', 1, 1)).toBe(1); // absent: the fallback
    expect(secondsFlag(benchArgs(['--seconds', '2.5']), 'seconds', 3, 0.5)).toBe(2.5);
    const l = benchArgs(['--words', '0,512,x', '--streams', '2,3', '--empty', '']);
    expect(() => wholeListFlag(l, 'words', 0, 0)).toThrow("--words: whole numbers, comma-separated, each of at least 0, got '0,512,x'");
    expect(wholeListFlag(benchArgs(['--words', '0,512']), 'words', 0, 0)).toEqual([0, 512]);
    expect(() => wholeFlag(l, 'streams', 1, 1)).toThrow("--streams: a whole number of at least 1, got '2,3'");
    expect(() => wholeFlag(l, 'empty', 1, 1)).toThrow("--empty: a whole number of at least 1, got ''");
  });

  it('keeps a negative number as a value', () => {
    expect(benchArgs(['--offset', '-1']).get('offset')).toBe('-1');
  });
});

// What the A/B benchmarks read off a daemon around a phase (daemonProbe).
describe('the daemon probe', () => {
  it("sums a histogram's _sum and _count over its label sets, and nothing else", () => {
    const text = [
      '# HELP vllm:time_to_first_token_seconds From admission to the engine to the first generated token',
      'vllm:time_to_first_token_seconds_bucket{le="0.01",model_name="a"} 3',
      'vllm:time_to_first_token_seconds_sum{model_name="a"} 0.5',
      'vllm:time_to_first_token_seconds_count{model_name="a"} 4',
      'vllm:time_to_first_token_seconds_sum{model_name="b"} 1.5',
      'vllm:time_to_first_token_seconds_count{model_name="b"} 6',
      'vllm:time_to_first_token_seconds_sum_other 9',
      'vllm:e2e_request_latency_seconds_sum{model_name="a"} 7',
    ].join('\n');
    expect(sumAndCount(text, 'vllm:time_to_first_token_seconds')).toEqual({ sum: 2, count: 10 });
  });

  it('leaves a phase it could not read out of the medians, and says so when it read none', () => {
    const line = ownSummary([
      { engineTtftMs: 6, httpThreadUsPerToken: 200 },
      { engineTtftMs: Number.NaN, httpThreadUsPerToken: 100 },
      { engineTtftMs: 8, httpThreadUsPerToken: 300 },
    ]);
    expect(line).toContain('from admission) 8.0 ms');
    expect(line).toContain('CPU 200 us a token');
    expect(ownSummary([{ engineTtftMs: Number.NaN, httpThreadUsPerToken: Number.NaN }])).toContain('from admission) not read, its HTTP thread\'s CPU not read');
  });

  it.skipIf(process.platform !== 'linux')("reads a thread's CPU time from /proc, and NaN for a thread that is not there", () => {
    const ms = threadCpuMs(process.pid, process.pid);
    expect(Number.isFinite(ms) && ms >= 0).toBe(true);
    expect(threadCpuMs(process.pid, 2 ** 30)).toBeNaN();
  });
});

// ab.js's `--a` / `--b` give each daemon its own node flags (a V8 flag on one side only).
describe('daemonNodeArgs', () => {
  it("takes the daemon's own DAEMON_NODE_ARGS before this process's, split on spaces", () => {
    expect(daemonNodeArgs({ DAEMON_NODE_ARGS: '--single-threaded-gc  --max-semi-space-size=32' }, { DAEMON_NODE_ARGS: '--cpu-prof' })).toEqual(['--single-threaded-gc', '--max-semi-space-size=32']);
    expect(daemonNodeArgs({}, { DAEMON_NODE_ARGS: '--cpu-prof --cpu-prof-dir=/tmp/p' })).toEqual(['--cpu-prof', '--cpu-prof-dir=/tmp/p']);
    expect(daemonNodeArgs({ DAEMON_NODE_ARGS: '' }, { DAEMON_NODE_ARGS: '--cpu-prof' })).toEqual([]); // set empty on a side: none there
    expect(daemonNodeArgs({}, {})).toEqual([]);
  });
});

// ab.js --both-sides: the second run exchanges the sides, and the two B / A readings give the
// settings' ratio with the side cancelled and the second daemon's lean.
describe('ab.js both sides', () => {
  it("exchanges A's and B's settings and checkouts, and leaves the rest", () => {
    const x = exchangeSides(benchArgs(['--a', 'K=1', '--b-root', '/old', '--streams', '16']));
    expect(Object.fromEntries(x)).toEqual({ b: 'K=1', 'a-root': '/old', streams: '16' });
    expect(Object.fromEntries(exchangeSides(x))).toEqual({ a: 'K=1', 'b-root': '/old', streams: '16' });
  });

  it('cancels the lean of the second daemon', () => {
    // B's settings 1.10x A's, the second daemon 1.05x the first: read 1.155 straight, 1.05 / 1.10 exchanged.
    const c = sideCancelled(1.1 * 1.05, 1.05 / 1.1);
    expect(c.settings).toBeCloseTo(1.1, 10);
    expect(c.lean).toBeCloseTo(1.05, 10);
  });

  it("reads each pair's B / A, its median and its geometric mean", () => {
    const r = pairRatios([{ rate: 100 }, { rate: 200 }, { rate: 100 }], [{ rate: 110 }, { rate: 180 }, { rate: 400 }]);
    expect(r.ratios).toEqual([1.1, 0.9, 4]);
    expect(r.median).toBe(1.1);
    expect(r.geo).toBeCloseTo(Math.cbrt(1.1 * 0.9 * 4), 12);
  });
});
