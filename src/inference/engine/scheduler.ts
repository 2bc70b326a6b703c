import { ApiError } from '../../errors.js';
import { log } from '../../log.js';
import type { BranchSpec, GenerateEvent, GenerateRequest } from '../engine-api.js';
import { engineMetrics as M } from './metrics.js';
import type { SchedulerOptions } from './options.js';
import { WANT_LOGITS, WANT_LOGPROBS, WANT_NONE, type Arch } from './protocol.js';
import type { StepResult, StepRows } from './runner.js';
import { sample, seededRandom } from './sampler.js';
import { StopMatcher } from './stop.js';
import { Detokenizer } from './tokenizer.js';

// The one owner of a model's batch slots (continuous batching).
//
// Each loop turn: drop finished and cancelled sequences, admit waiting ones
// into free slots, run one step. A step is either a decode step (every
// sequence that runs one token: decoding streams, one row each) or a bounded
// prefill step (prompt and branch chunks, at most prefillTokensPerStepMax
// padded positions); when both have work they alternate, so a new prompt
// delays running streams by one bounded step at most.
//
// Steps are pipelined with text: as soon as a step's logits are sampled the
// next step is sent to the worker, and the main thread then detokenises,
// matches stop strings and wakes readers while the worker computes. A
// sequence that a stop string ends while its next token is in flight wastes
// that one row; its result is dropped.

export interface ScoreRequest {
  prefixTokens: number[];
  /** A plain token list continues the prefix; a BranchSpec continues the prefix (parent -1) or an earlier branch. */
  branches: Array<number[] | BranchSpec>;
  signal?: AbortSignal;
}

export interface ScoreResult {
  /** log-softmax over the vocabulary at the last position of each branch. */
  logprobs: Float32Array[];
  /** Tokens run: the prefix once plus every branch. */
  processedTokens: number;
}

/** What the scheduler needs of a model's worker. */
export interface StepRunner {
  readonly arch: Arch;
  step(rows: StepRows): Promise<StepResult>;
  fork(from: number, to: number[]): void;
  free(seqs: number[]): void;
}

export interface TextCodec {
  decode(ids: number[]): string;
  readonly eosIds: ReadonlySet<number>;
}

interface Seq {
  id: number;
  /** Tokens to run, in order; `next` is the first not yet run. */
  tokens: number[];
  next: number;
  /** Tokens in the worker's cache. */
  kvLen: number;
  /** Finished or cancelled: freed at the next reap. */
  done: boolean;
  gen?: Gen;
  job?: Job;
  /** Branch index in its job, or -1 for the job's prefix. */
  branch: number;
}

interface Gen {
  seq: Seq;
  req: GenerateRequest;
  state: 'waiting' | 'running' | 'finished';
  rand: () => number;
  detok: Detokenizer;
  stop: StopMatcher;
  stream: GenStream;
  promptLen: number;
  /** Tokens sampled (EOS included). */
  sampled: number;
  /** Sampled, not yet turned into text (pipelined); `finish` set when the last one ends the sequence. */
  textQueue: number[];
  finish?: 'stop' | 'length';
  enqueuedAt: number;
  lastTokenAt: number;
  onAbort?: () => void;
}

interface Job {
  state: 'waiting' | 'running' | 'finished';
  prefix: number[];
  branches: BranchSpec[];
  /** children[p + 1]: the branches that continue branch p (p = -1: the prefix). */
  children: number[][];
  results: Float32Array[];
  left: number;
  processed: number;
  seqs: Seq[];
  resolve: (r: ScoreResult) => void;
  reject: (e: unknown) => void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

type Unit = { gen: Gen; job?: undefined } | { job: Job; gen?: undefined };

/** Counters of the steps run, for profiling and tests (engine.stats()). */
export interface StepStats {
  steps: number;
  decodeSteps: number;
  prefillSteps: number;
  rows: number;
  /** How the worker produced each step's past KV. */
  modes: { reuse: number; rebuild: number; side: number; fresh: number };
  /** Worker time building inputs, inside session.run, and on outputs; main-thread time per turn outside the await. */
  prepMs: number;
  runMs: number;
  postMs: number;
  mainMs: number;
  /** Wall time from sending a step to its answer beyond the worker's own time (or the main thread's text work, when longer): message passing. */
  transportMs: number;
}

const newStats = (): StepStats => ({
  steps: 0,
  decodeSteps: 0,
  prefillSteps: 0,
  rows: 0,
  modes: { reuse: 0, rebuild: 0, side: 0, fresh: 0 },
  prepMs: 0,
  runMs: 0,
  postMs: 0,
  mainMs: 0,
  transportMs: 0,
});

interface PlanRow {
  seq: Seq;
  n: number;
  want: number;
}

export class Scheduler {
  private nextSeq = 1;
  private readonly waiting: Unit[] = [];
  private readonly active: Seq[] = [];
  private slots = 0;
  private looping = false;
  private lastWasDecode = false;
  private readonly vocab: number;
  private readonly labels: { model: string };
  stats: StepStats = newStats();

  constructor(
    readonly modelId: string,
    private readonly runner: StepRunner,
    private readonly text: TextCodec,
    private readonly opts: SchedulerOptions,
    readonly contextLength: number,
  ) {
    this.vocab = runner.arch.vocab;
    this.labels = { model: modelId };
    M.running.set(this.labels, 0);
    M.waiting.set(this.labels, 0);
  }

  resetStats(): StepStats {
    const s = this.stats;
    this.stats = newStats();
    return s;
  }

  /** Sequences and jobs holding a slot, and requests waiting for one. */
  get load(): { running: number; waiting: number } {
    return { running: this.slots, waiting: this.waiting.length };
  }

  // ------------------------------------------------------------ admission

  private checkTokens(tokens: number[], param: string): void {
    for (const t of tokens) {
      if (!Number.isInteger(t) || t < 0 || t >= this.vocab) throw new ApiError('invalid', `${param}: token id ${t} is outside the vocabulary of ${this.vocab}`, { param });
    }
  }

  private refuseIfFull(): void {
    // A burst may sit in `waiting` until the loop turns: free slots count as room too.
    if (this.waiting.length >= this.opts.queueDepthMax + Math.max(0, this.opts.batchSizeMax - this.slots)) {
      throw new ApiError('overloaded', `model ${this.modelId} has ${this.waiting.length} requests waiting, its limit; retry shortly`, {
        retryAfterMs: this.opts.overloadRetryAfterMs,
      });
    }
  }

  private enqueue(u: Unit): void {
    this.waiting.push(u);
    M.waiting.set(this.labels, this.waiting.length);
    this.kick();
  }

  /**
   * Admits a generation now (a full queue or a too-long prompt throws here,
   * before any response starts) and returns its event stream. Closing the
   * stream early (break, return()) or aborting the signal cancels the
   * sequence and frees its slot before the next step.
   */
  generate(req: GenerateRequest): AsyncGenerator<GenerateEvent> {
    const n = req.promptTokens.length;
    if (n === 0) throw new ApiError('invalid', 'messages: the prompt encodes to no tokens', { param: 'messages' });
    if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1) throw new ApiError('invalid', `max_tokens: must be a positive integer (got ${req.maxTokens})`, { param: 'max_tokens' });
    if (n + req.maxTokens > this.contextLength) {
      throw new ApiError(
        'invalid',
        `this model's maximum context length is ${this.contextLength} tokens; the prompt takes ${n} and max_tokens asks for ${req.maxTokens}`,
        { param: n >= this.contextLength ? 'messages' : 'max_tokens', code: 'context_length_exceeded' },
      );
    }
    this.checkTokens(req.promptTokens, 'messages');
    this.refuseIfFull();
    const now = performance.now();
    const seq: Seq = { id: this.nextSeq++, tokens: [...req.promptTokens], next: 0, kvLen: 0, done: false, branch: 0 };
    const gen: Gen = {
      seq,
      req,
      state: 'waiting',
      rand: seededRandom(req.seed ?? (Math.random() * 2 ** 32) >>> 0),
      detok: new Detokenizer(this.text, req.promptTokens),
      stop: new StopMatcher(req.stop),
      stream: undefined as unknown as GenStream,
      promptLen: n,
      sampled: 0,
      textQueue: [],
      enqueuedAt: now,
      lastTokenAt: now,
    };
    seq.gen = gen;
    gen.stream = new GenStream(
      () => {
        // The reader took events: a paused sequence may run again.
        if (!seq.done && gen.stream.unreadTokens < this.opts.pendingTokensMax) this.kick();
      },
      () => this.endGen(gen, 'cancelled'),
    );
    if (req.signal?.aborted) {
      this.endGen(gen, 'cancelled');
      return gen.stream;
    }
    if (req.signal) {
      gen.onAbort = () => this.endGen(gen, 'cancelled');
      req.signal.addEventListener('abort', gen.onAbort, { once: true });
    }
    this.enqueue({ gen });
    return gen.stream;
  }

  /** Log-softmax at the last position of each branch; the prefix is prefilled once and forked into every branch. */
  scoreBranches(req: ScoreRequest): Promise<ScoreResult> {
    const branches: BranchSpec[] = req.branches.map((b) => (Array.isArray(b) ? { parent: -1, tokens: b } : b));
    const children: number[][] = [[], ...branches.map(() => [] as number[])];
    try {
      const depth: number[] = [];
      let longest = 0;
      branches.forEach((b, i) => {
        if (b.tokens.length === 0) throw new ApiError('invalid', `branch ${i} has no tokens`);
        if (!Number.isInteger(b.parent) || b.parent < -1 || b.parent >= i) throw new ApiError('invalid', `branch ${i}: parent ${b.parent} must be -1 or an earlier branch`);
        depth[i] = (b.parent >= 0 ? depth[b.parent]! : 0) + b.tokens.length;
        longest = Math.max(longest, depth[i]!);
        children[b.parent + 1]!.push(i);
      });
      if (req.prefixTokens.length + longest > this.contextLength) {
        throw new ApiError('invalid', `the prefix (${req.prefixTokens.length} tokens) and its longest branch (${longest}) exceed the context length of ${this.contextLength}`, {
          param: 'state',
          code: 'context_length_exceeded',
        });
      }
      this.checkTokens(req.prefixTokens, 'state');
      for (const b of branches) this.checkTokens(b.tokens, 'questions');
      if (branches.length === 0) return Promise.resolve({ logprobs: [], processedTokens: 0 });
      if (req.signal?.aborted) throw new ApiError('unavailable', 'evaluation cancelled');
      this.refuseIfFull();
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise<ScoreResult>((resolve, reject) => {
      const job: Job = {
        state: 'waiting',
        prefix: req.prefixTokens,
        branches,
        children,
        results: new Array(branches.length),
        left: branches.length,
        processed: req.prefixTokens.length + branches.reduce((s, b) => s + b.tokens.length, 0),
        seqs: [],
        resolve,
        reject,
        signal: req.signal,
      };
      if (req.signal) {
        job.onAbort = () => this.endJob(job, new ApiError('unavailable', 'evaluation cancelled'));
        req.signal.addEventListener('abort', job.onAbort, { once: true });
      }
      this.enqueue({ job });
    });
  }

  // ------------------------------------------------------------ ends

  private release(u: Unit): void {
    const s = u.gen ?? u.job!;
    if (s.state === 'running') this.slots--;
    else if (s.state === 'waiting') {
      const i = this.waiting.findIndex((w) => (w.gen ?? w.job) === s);
      if (i >= 0) this.waiting.splice(i, 1);
      M.waiting.set(this.labels, this.waiting.length);
    }
    s.state = 'finished';
    M.running.set(this.labels, this.slots);
  }

  /**
   * Ends a generation exactly once: frees its slot (its KV is freed at the
   * next reap, before the next step), tells its reader (a final event, or the
   * error) and reports the tokens really run to `onEnd`: the prompt tokens
   * sent to the model and every token sampled.
   */
  private endGen(g: Gen, how: 'stop' | 'length' | 'cancelled' | Error): void {
    if (g.state === 'finished') return;
    this.release({ gen: g });
    g.seq.done = true;
    g.textQueue.length = 0;
    if (g.onAbort) g.req.signal?.removeEventListener('abort', g.onAbort);
    const usage = { promptTokens: Math.min(g.seq.next, g.promptLen), completionTokens: g.sampled };
    if (how instanceof Error) g.stream.fail(how);
    else g.stream.push({ type: 'done', finishReason: how, ...usage });
    try {
      g.req.onEnd?.(usage);
    } catch (e) {
      log.error({ err: e, model: this.modelId }, 'onEnd callback failed');
    }
    this.kick();
  }

  private endJob(job: Job, err?: unknown): void {
    if (job.state === 'finished') return;
    this.release({ job });
    for (const s of job.seqs) s.done = true;
    if (job.onAbort) job.signal?.removeEventListener('abort', job.onAbort);
    if (err) job.reject(err);
    else job.resolve({ logprobs: job.results, processedTokens: job.processed });
    this.kick();
  }

  private failSeq(s: Seq, e: unknown): void {
    const err = e instanceof ApiError ? e : new ApiError('internal', 'model step failed');
    s.done = true;
    if (s.gen) this.endGen(s.gen, err);
    if (s.job) this.endJob(s.job, err);
  }

  // ------------------------------------------------------------ loop

  private kick(): void {
    if (this.looping) return;
    this.looping = true;
    setImmediate(() => void this.loop());
  }

  private reap(): void {
    const gone: number[] = [];
    let w = 0;
    for (let r = 0; r < this.active.length; r++) {
      const s = this.active[r]!;
      if (s.done) gone.push(s.id);
      else this.active[w++] = s;
    }
    this.active.length = w;
    this.runner.free(gone);
  }

  private admit(): void {
    while (this.waiting.length && this.slots < this.opts.batchSizeMax) {
      const u = this.waiting.shift()!;
      this.slots++;
      if (u.gen) {
        u.gen.state = 'running';
        this.active.push(u.gen.seq);
      } else {
        const job = u.job!;
        job.state = 'running';
        if (job.prefix.length > 0) {
          const p: Seq = { id: this.nextSeq++, tokens: job.prefix, next: 0, kvLen: 0, done: false, job, branch: -1 };
          job.seqs.push(p);
          this.active.push(p);
        } else {
          this.startChildren(job, -1, undefined);
        }
      }
    }
    M.waiting.set(this.labels, this.waiting.length);
    M.running.set(this.labels, this.slots);
  }

  /**
   * Starts the branches that continue `parent` (-1: the prefix) once it has
   * run: each is a fork of the parent's KV (shared in the worker, nothing
   * copied until a step needs it). The parent is freed after the fork (the
   * worker applies messages in order).
   */
  private startChildren(job: Job, parent: number, from: Seq | undefined): void {
    const kids = job.children[parent + 1]!;
    const ids: number[] = [];
    for (const b of kids) {
      const s: Seq = { id: this.nextSeq++, tokens: job.branches[b]!.tokens, next: 0, kvLen: from?.kvLen ?? 0, done: false, job, branch: b };
      ids.push(s.id);
      job.seqs.push(s);
      this.active.push(s);
    }
    if (from) {
      if (ids.length) this.runner.fork(from.id, ids);
      from.done = true;
    }
  }

  private paused(s: Seq): boolean {
    return s.gen !== undefined && s.gen.stream.unreadTokens >= this.opts.pendingTokensMax;
  }

  /** The next chunk of a sequence: one token when this model cannot run several after a non-empty past. */
  private chunk(s: Seq): number {
    const pending = s.tokens.length - s.next;
    if (s.kvLen > 0 && !this.runner.arch.multiTokenWithPast) return Math.min(pending, 1);
    return Math.min(pending, this.opts.prefillTokensPerStepMax);
  }

  private wantOf(s: Seq, n: number): number {
    if (s.next + n < s.tokens.length) return WANT_NONE;
    if (s.gen) return WANT_LOGITS;
    return s.branch >= 0 ? WANT_LOGPROBS : WANT_NONE;
  }

  private plan(): { rows: PlanRow[]; phase: 'decode' | 'prefill' } | undefined {
    const decode: PlanRow[] = [];
    const prefill: Seq[] = [];
    for (const s of this.active) {
      if (s.done || s.next >= s.tokens.length || (s.gen && (s.gen.finish || this.paused(s)))) continue;
      const n = this.chunk(s);
      if (n === 1) {
        if (decode.length < this.opts.batchSizeMax) decode.push({ seq: s, n, want: this.wantOf(s, 1) });
      } else prefill.push(s);
    }
    if (!decode.length && !prefill.length) return undefined;
    if (decode.length && (!prefill.length || !this.lastWasDecode)) {
      this.lastWasDecode = true;
      return { rows: decode, phase: 'decode' };
    }
    this.lastWasDecode = false;
    // First come first served; the first row sets the width, later rows are cut to it.
    const budget = this.opts.prefillTokensPerStepMax;
    const rows: PlanRow[] = [];
    let width = 0;
    for (const s of prefill) {
      if (rows.length >= this.opts.batchSizeMax) break;
      const whole = this.chunk(s);
      let n = whole;
      if (rows.length === 0) width = n;
      else {
        n = Math.min(n, width);
        if ((rows.length + 1) * width > budget) break;
        // A model that continues one token at a time should take its first chunk whole.
        if (n < whole && !this.runner.arch.multiTokenWithPast) continue;
      }
      rows.push({ seq: s, n, want: this.wantOf(s, n) });
    }
    return { rows, phase: 'prefill' };
  }

  private toMessage(rows: PlanRow[]): StepRows {
    const B = rows.length;
    let total = 0;
    for (const r of rows) total += r.n;
    const seqs = new Int32Array(B);
    const counts = new Int32Array(B);
    const want = new Uint8Array(B);
    const tokens = new Int32Array(total);
    let k = 0;
    for (let i = 0; i < B; i++) {
      const r = rows[i]!;
      seqs[i] = r.seq.id;
      counts[i] = r.n;
      want[i] = r.want;
      for (let j = 0; j < r.n; j++) tokens[k++] = r.seq.tokens[r.seq.next + j]!;
    }
    return { seqs, counts, tokens, want };
  }

  private async loop(): Promise<void> {
    let text: Gen[] = [];
    try {
      for (;;) {
        const t0 = performance.now();
        this.reap();
        this.admit();
        const plan = this.plan();
        let inflight: Promise<StepResult> | undefined;
        if (plan) {
          M.batchSize.observe({ model: this.modelId, phase: plan.phase }, plan.rows.length);
          inflight = this.runner.step(this.toMessage(plan.rows));
          // Rows are marked as run now: the next plan must not send them again.
          for (const r of plan.rows) r.seq.next += r.n;
        }
        // Text work of the previous step overlaps this step's compute.
        const tSend = performance.now();
        const hadText = text.length > 0;
        for (const g of text) this.emitText(g);
        text = [];
        if (!plan || !inflight) {
          if (hadText) continue;
          break;
        }
        let res: StepResult;
        const t1 = performance.now();
        try {
          res = await inflight;
        } catch (e) {
          log.error({ err: e, model: this.modelId, rows: plan.rows.length }, 'model step failed');
          for (const r of plan.rows) this.failSeq(r.seq, e);
          continue;
        }
        const t2 = performance.now();
        text = this.apply(plan.rows, plan.phase, res);
        const w = res.timings;
        const st = this.stats;
        st.steps++;
        if (plan.phase === 'decode') st.decodeSteps++;
        else st.prefillSteps++;
        st.rows += plan.rows.length;
        st.modes[w.mode]++;
        st.prepMs += w.prepMs;
        st.runMs += w.runMs;
        st.postMs += w.postMs;
        st.transportMs += Math.max(0, t2 - tSend - Math.max(w.prepMs + w.runMs + w.postMs, t1 - tSend));
        st.mainMs += t1 - t0 + (performance.now() - t2);
      }
    } catch (e) {
      log.error({ err: e, model: this.modelId }, 'scheduler loop failed');
      for (const s of this.active) this.failSeq(s, e);
    } finally {
      for (const g of text) this.emitText(g);
      this.looping = false;
      this.reap();
      M.running.set(this.labels, this.slots);
      M.waiting.set(this.labels, this.waiting.length);
      if (this.plannable()) this.kick();
    }
  }

  private plannable(): boolean {
    if (this.waiting.length && this.slots < this.opts.batchSizeMax) return true;
    return this.active.some((s) => !s.done && s.next < s.tokens.length && !(s.gen && (s.gen.finish || this.paused(s))));
  }

  /** Applies a step's results: KV lengths, sampling, branch results, prefix forks. Returns the streams with new text work. */
  private apply(rows: PlanRow[], phase: 'decode' | 'prefill', res: StepResult): Gen[] {
    M.kvBytes.set(this.labels, res.kvBytes);
    const V = this.vocab;
    const text: Gen[] = [];
    const now = performance.now();
    let o = 0;
    let promptTokens = 0;
    for (const r of rows) {
      const s = r.seq;
      s.kvLen += r.n;
      const row = r.want ? o++ : -1;
      if (!(s.gen && s.gen.sampled > 0)) promptTokens += r.n;
      if (s.done) continue;
      if (s.gen) {
        if (row < 0) continue;
        const g = s.gen;
        const tok = sample(res.logits, row * V, V, g.req, g.rand);
        if (g.sampled === 0) M.ttft.observe(this.labels, (now - g.enqueuedAt) / 1000);
        else M.itl.observe(this.labels, (now - g.lastTokenAt) / 1000);
        g.lastTokenAt = now;
        g.sampled++;
        M.generatedTokens.inc(this.labels);
        g.textQueue.push(tok);
        if (this.text.eosIds.has(tok)) g.finish = 'stop';
        else if (g.sampled >= g.req.maxTokens) g.finish = 'length';
        else s.tokens.push(tok);
        if (g.textQueue.length === 1) text.push(g);
      } else if (s.job) {
        const job = s.job;
        if (s.next < s.tokens.length) continue;
        if (s.branch >= 0) job.results[s.branch] = res.logits.slice(row * V, (row + 1) * V);
        this.startChildren(job, s.branch, s);
        if (s.branch >= 0 && --job.left === 0) this.endJob(job);
      }
    }
    if (promptTokens) M.promptTokens.inc(this.labels, promptTokens);
    void phase;
    return text;
  }

  /** Sampled tokens to text events: incremental detokenisation, stop strings, the final event. */
  private emitText(g: Gen): void {
    if (g.state === 'finished') return;
    const toks = g.textQueue.splice(0);
    for (let i = 0; i < toks.length; i++) {
      const tok = toks[i]!;
      const last = i === toks.length - 1;
      if (last && g.finish === 'stop' && this.text.eosIds.has(tok)) {
        // EOS: counted, not shown; the text held for stop strings is released.
        const rest = g.stop.push(g.detok.flush()).out + g.stop.flush();
        if (rest) g.stream.push({ type: 'delta', text: rest, tokenIds: [] });
        this.endGen(g, 'stop');
        return;
      }
      const { out, stopped } = g.stop.push(g.detok.push(tok));
      g.stream.push({ type: 'delta', text: out, tokenIds: [tok] });
      if (stopped) {
        this.endGen(g, 'stop');
        return;
      }
      if (last && g.finish === 'length') {
        const tail = g.stop.push(g.detok.flush());
        if (tail.stopped) {
          if (tail.out) g.stream.push({ type: 'delta', text: tail.out, tokenIds: [] });
          this.endGen(g, 'stop');
          return;
        }
        const rest = tail.out + g.stop.flush();
        if (rest) g.stream.push({ type: 'delta', text: rest, tokenIds: [] });
        this.endGen(g, 'length');
        return;
      }
    }
  }

  /** Fails everything (the model is going away). */
  close(): void {
    const err = new ApiError('unavailable', `model ${this.modelId} is shutting down`);
    for (const u of this.waiting.splice(0)) {
      if (u.gen) {
        this.endGen(u.gen, err);
      } else {
        u.job!.state = 'finished';
        u.job!.reject(err);
      }
    }
    for (const s of this.active) this.failSeq(s, err);
  }
}

/**
 * A generation's event stream: an AsyncGenerator whose return() (a `break`
 * in for-await, or an explicit call, even before the first read) cancels the
 * sequence. Counts unread tokens for the slow-reader pause.
 */
export class GenStream implements AsyncGenerator<GenerateEvent, void, undefined> {
  private readonly events: GenerateEvent[] = [];
  private head = 0;
  private readonly waiters: Array<{ resolve: (r: IteratorResult<GenerateEvent, void>) => void; reject: (e: unknown) => void }> = [];
  private error: unknown;
  private ended = false;
  unreadTokens = 0;

  constructor(
    private readonly onRead: () => void,
    private readonly onClose: () => void,
  ) {}

  push(ev: GenerateEvent): void {
    if (this.ended) return;
    const w = this.waiters.shift();
    if (w) {
      if (ev.type === 'done') this.ended = true;
      w.resolve({ value: ev, done: false });
      if (this.ended) this.drainWaiters();
      return;
    }
    this.events.push(ev);
    if (ev.type === 'delta') this.unreadTokens += ev.tokenIds.length;
  }

  fail(e: unknown): void {
    if (this.ended) return;
    this.error = e;
    const w = this.waiters.shift();
    if (w) {
      this.ended = true;
      w.reject(e);
      this.drainWaiters();
    }
  }

  private drainWaiters(): void {
    for (const w of this.waiters.splice(0)) w.resolve({ value: undefined, done: true });
  }

  next(): Promise<IteratorResult<GenerateEvent, void>> {
    if (this.head < this.events.length) {
      const ev = this.events[this.head]!;
      this.events[this.head++] = undefined as unknown as GenerateEvent;
      if (this.head > 1024 && this.head * 2 > this.events.length) {
        this.events.splice(0, this.head);
        this.head = 0;
      }
      if (ev.type === 'delta') this.unreadTokens -= ev.tokenIds.length;
      else this.ended = true;
      this.onRead();
      return Promise.resolve({ value: ev, done: false });
    }
    if (this.error !== undefined && !this.ended) {
      this.ended = true;
      return Promise.reject(this.error);
    }
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  return(): Promise<IteratorResult<GenerateEvent, void>> {
    const wasEnded = this.ended && this.head >= this.events.length;
    this.ended = true;
    this.events.length = 0;
    this.head = 0;
    this.unreadTokens = 0;
    this.drainWaiters();
    if (!wasEnded) this.onClose();
    return Promise.resolve({ value: undefined, done: true });
  }

  throw(e: unknown): Promise<IteratorResult<GenerateEvent, void>> {
    void this.return();
    return Promise.reject(e);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }
}
