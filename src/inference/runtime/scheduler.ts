import { log } from '../../log.js';
import { EngineFailed, EngineRefused, scoreTokens, sharedLead, type BranchSpec, type EngineFailure, type GenerateEvent, type GenerateRequest, type TokenLogprob } from '../engine-api.js';
import { kvBytesPerPosition, type KvLayout } from './kv.js';
import { engineMetrics as M, kvCacheUsage } from './metrics.js';
import { inStepBudget, type EngineOptions } from './options.js';
import { endsGeneration, type SamplerSpec } from './protocol.js';
import { RunnerClosed, WorkerLost, type Runner } from './runner.js';
import { CompletionRate, slotWaitMs, StepPace } from './throughput.js';
import { logSoftmax } from './sampler.js';
import { EventStream, Generation } from './output.js';
import type { ModelText } from './text.js';
import { commonOpening, KeptPrompts, worthStarting, type KeptPrompt } from './kept-prompts.js';
import type { StepRow } from './protocol.js';

// One owner of a model's batch slots. Sequences join between steps and leave
// when done; the worker either decodes (a run of steps, every decoding
// sequence one token each, sampled in the worker) or takes a bounded prefill
// step (prompt chunks), alternating when both have work, so a long prompt
// delays running streams by one step at most.

interface Branch {
  job: ScoreJob;
  index: number;
}

interface ScoreJob {
  branches: BranchSpec[];
  children: number[][];
  logprobs: Float32Array[];
  left: number;
  processed: number;
  resolve: (r: { logprobs: Float32Array[]; processedTokens: number }) => void;
  reject: (e: unknown) => void;
  cancelled: boolean;
}

interface Seq {
  id: number;
  /** Tokens not yet run through the model. */
  pending: number[];
  promptLen: number;
  gen?: Generation;
  branch?: Branch;
  /**
   * The score jobs whose prefix this is: each forks its branches from it once it is prefilled.
   * Several when concurrent requests of one scope (one user) send the same prefix: it runs once.
   */
  prefixOf?: ScoreJob[];
  /** Its key in `prefixes` (scope and the request's prefix), while jobs may still join it. */
  prefixKey?: string;
  /** The questions' shared lead it runs after the request's prefix (sharedLead). */
  prefixLead?: number[];
  cancelled: boolean;
  /** Its prompt was sent to join the decode run in flight; the answer is on its way. */
  joining?: boolean;
  /** The decode run (Scheduler.runId) its prompt was sent to join. */
  joinedRun?: number;
  /** A generation's user (GenerateRequest.shareScope), where prompts are kept (kept-prompts.ts). */
  scope?: string;
  /** Its whole prompt and the tokens the worker sampled for it, where it may be kept. */
  prompt?: number[];
  sampled?: number[];
  /**
   * The generation its cache starts from (`seq`: kept, or still running) and the tokens taken from
   * it: sent with its first prompt chunk. A kept one is held (KeptPrompts.use) until that step is answered.
   */
  from?: { seq: number; tokens: number[]; kept?: KeptPrompt };
  /** Its worker sequence has been freed or kept (release): the reaper leaves it. */
  released?: boolean;
  /** Prompt tokens its cache started with from a kept generation (usage's cachedInputTokens). */
  cached?: number;
}

/** A prefilled prefix kept for later jobs of its key (Scheduler.kept). */
interface KeptPrefix {
  seq: Seq;
  bytes: number;
  /** Forks from it in flight: it is not freed under them. */
  forking: number;
}

export class Scheduler {
  private nextSeq = 1;
  private readonly waiting: Seq[] = [];
  private readonly active = new Set<Seq>();
  /** Prefixes not yet prefilled, by scope and the request's prefix: a score job with the same one may join it. */
  private readonly prefixes = new Map<string, Seq>();
  /**
   * Prefixes prefilled for earlier jobs, kept by the same key within opts.prefixCacheBytesMax:
   * a later job of the key forks its questions from one instead of prefilling it again. The
   * map's order is their use, the least recent first (the first evicted).
   */
  private readonly kept = new Map<string, KeptPrefix>();
  private keptBytes = 0;
  private running = false;
  /** The decode run in flight, or the last one: a number each. */
  private runId = 0;
  private lastWasDecode = false;
  private lastPrefillWasBranches = false;
  /** While a decode run is in flight: ends it after the worker's current step. */
  private replan: (() => void) | undefined;
  /** While a decode run is in flight: sends an arriving prompt to join it; false when it cannot. */
  private joinRun: ((seq: Seq) => boolean) | undefined;
  /** Joins made in this turn of the event loop, not yet sent (sendJoins). */
  private readonly joinsToSend: Seq[] = [];
  private readonly vocab: number;
  private readonly completions = new CompletionRate();
  /** Its step times (seeded by the worker's warm-up): the wait at face value (faceValueWaitMs). */
  private readonly pace = new StepPace();
  /** Finished generations kept for later prompts of their user (opts.chatPrefixCacheBytesMax); none where the worker keeps none. */
  private readonly keptPrompts: KeptPrompts | undefined;
  /** Running generations of each user that a prompt may start from (startFromKept), until released. */
  private readonly liveByScope = new Map<string, Set<Seq>>();
  /** Generations released in this turn of the event loop, not yet sent (release): one message each way a turn, not one a sequence. */
  private readonly released = { keep: [] as number[], free: [] as number[] };

  constructor(
    readonly modelId: string,
    private readonly runner: Runner,
    private readonly text: ModelText,
    private readonly opts: EngineOptions,
    private readonly contextLength: number,
  ) {
    this.vocab = runner.arch.vocab;
    if (runner.warmPace) this.pace.seed(runner.warmPace);
    runner.onLost = (e) => this.workerLost(e);
    if (opts.chatPrefixCacheBytesMax > 0 && runner.arch.keepsGenerations) {
      this.keptPrompts = new KeptPrompts(opts.chatPrefixCacheBytesMax, kvBytesPerPosition(runner.arch), (seqs) => this.toRelease('free', seqs));
    }
  }

  /** A sequence takes a batch slot (its queue time ends here). */
  private activate(seq: Seq): void {
    if (seq.gen) seq.gen.scheduledAt ??= performance.now();
    this.active.add(seq);
  }

  /** KV positions the live sequences hold: the tokens each has run through the model (prompt prefilled, tokens fed back). */
  private kvPositionsHeld(): number {
    let n = 0;
    for (const s of this.active) n += Math.max(0, s.promptLen + (s.gen?.produced ?? 0) - s.pending.length);
    return n;
  }

  private reportKvUsage(): void {
    M.kvUsage.set(this.runner.labels, kvCacheUsage(this.kvPositionsHeld(), this.opts.batchSizeMax, this.contextLength));
  }

  /**
   * Batch slots held: a generation's until it has finished, a scoring prefix's until reaped. A
   * finished generation stays in `active` until the decode run it ended in is over, but the
   * worker gave its slot back at the end of that step (worker.ts freeEnded). Counted, it kept a
   * full batch's next request out of the run in flight (the run was cut to let it in), and on a
   * fresh daemon, before four requests had ended, such a request was refused as if no start could
   * be promised: 64 clients streaming back to back got 429s in their first seconds.
   */
  private slotsUsed(): number {
    let n = 0;
    for (const s of this.active) if (holdsSlot(s)) n++;
    return n;
  }

  /**
   * How long a request arriving now would wait for a batch slot: nothing while the
   * requests waiting do not fill the free slots, else its place in the queue over
   * the rate slots have been freeing up lately; while too few requests have ended
   * lately for that rate to tell (a fresh or long-idle model, or every slot held by
   * long streams), the work ahead at face value.
   */
  estimatedWait(): { ms: number; atFaceValue: boolean } {
    const ahead = this.waiting.length - (this.opts.batchSizeMax - this.slotsUsed());
    if (ahead < 0) return { ms: 0, atFaceValue: false };
    const rate = this.completions.perSecond();
    return rate === undefined ? { ms: this.faceValueWaitMs(), atFaceValue: true } : { ms: ((ahead + 1) * 1000) / rate, atFaceValue: false };
  }

  /**
   * The wait for a slot if every request running or waiting holds its slot until it has made its
   * max_tokens, the most it may (one that ends early only shortens the wait), at the measured
   * step time (StepPace) of a full batch whose rows sit at the requests' mean position over their
   * lives, and its prompt at the measured time a prompt token, which holds up every slot (the
   * worker runs prompts between decode steps). Before, with no rate there was no
   * promise at all: a burst beyond the free slots into a fresh or long-idle model was refused
   * whole, 429 to every request past the 64th. Infinite while no step was timed (a model with no
   * warm-up, before its first steps).
   */
  private faceValueWaitMs(): number {
    const holding = [...this.active].filter(holdsSlot);
    // A request's mean position over its life: its prompt, then half its max_tokens.
    let positions = 0;
    for (const s of [...holding, ...this.waiting]) positions += s.promptLen + (s.gen ? s.gen.req.maxTokens / 2 : 0);
    const stepMs = this.pace.decodeStepMs(this.opts.batchSizeMax, positions / Math.max(1, holding.length + this.waiting.length));
    const tokenMs = this.pace.promptTokenMs();
    if (stepMs === undefined || tokenMs === undefined) return Infinity;
    // A generation's prompt until its first token, then a step a token; an evaluation's prefix, then about a step.
    const promptMs = (s: Seq) => (s.gen && s.gen.produced > 0 ? 0 : s.pending.length) * tokenMs;
    const decodeMs = (s: Seq) => (s.gen ? s.gen.req.maxTokens - s.gen.produced : 1) * stepMs;
    // The worker runs prompts between decode steps: those of the held slots hold up every slot.
    const heldPromptsMs = holding.reduce((t, s) => t + promptMs(s), 0);
    return slotWaitMs(this.opts.batchSizeMax, holding.map((s) => heldPromptsMs + decodeMs(s)), this.waiting.map((s) => ({ promptMs: promptMs(s), decodeMs: decodeMs(s) })));
  }

  /** Requests this scheduler holds, running and waiting: how replicas.ts's pickReplica weighs it. */
  load(): number {
    return this.slotsUsed() + this.waiting.length;
  }

  /** Whether its model's worker is up or coming back. */
  get alive(): boolean {
    return this.runner.alive;
  }

  private admit(seq: Seq): void {
    if (!this.runner.alive) {
      throw new EngineRefused(`model ${this.modelId} is down: its worker kept dying (see the daemon's log); the other models still serve`, 'model_down');
    }
    if (this.waiting.length >= this.opts.queueDepthMax) {
      throw new EngineRefused(`model ${this.modelId} has ${this.waiting.length} requests waiting, its limit; retry shortly`, 'queue_full', 1000);
    }
    const { ms: waitMs, atFaceValue } = this.estimatedWait();
    M.admissionWait.set(this.runner.labels, Number.isFinite(waitMs) ? waitMs / 1000 : -1);
    if (waitMs > this.opts.admissionWaitMsMax) {
      const about = Number.isFinite(waitMs) ? `about ${Math.round(waitMs / 1000)} s` : 'longer than any bound (no request has ended lately and no step was timed)';
      // Said how it was reckoned: at face value (no request ended lately) it is an upper bound, not a pace.
      const reckoned = Number.isFinite(waitMs) && atFaceValue ? ' if every request ahead makes its max_tokens (none has ended lately to go by)' : '';
      throw new EngineRefused(
        `model ${this.modelId} is busy: a request would wait ${about} to start, over its limit of ${this.opts.admissionWaitMsMax / 1000} s${reckoned}; retry later`,
        'busy',
        // Until the queue ahead would have moved enough (without a rate, a second), spread by
        // up to half again so that clients refused together do not all come back together.
        (Number.isFinite(waitMs) ? waitMs - this.opts.admissionWaitMsMax : 1_000) * (1 + Math.random() / 2),
      );
    }
    this.queue(seq);
    if (this.joinRun?.(seq)) return;
    // A full batch in a decode run: the first slot that comes free goes to the queue's head
    // (fillFreedSlots); ending the run now would free none.
    if (this.joinRun && this.slotsUsed() >= this.opts.batchSizeMax) return;
    // Into an idle model the prompt goes now, not after the rest of this turn (the request's
    // response headers, its first event): 0.15-0.5 ms of a lone stream's time to first token.
    // Busy, the loop takes what arrived in the turn together.
    this.kick(seq.gen !== undefined && !this.running && this.active.size === 0);
  }

  private queue(seq: Seq): void {
    this.waiting.push(seq);
    M.waiting.set(this.runner.labels, this.waiting.length);
  }

  private unqueue(index: number): Seq {
    const [seq] = this.waiting.splice(index, 1);
    M.waiting.set(this.runner.labels, this.waiting.length);
    return seq!;
  }

  /** A generation whose whole (rest of its) prompt fits one step's budget, not yet sent: it can join a decode run. */
  private joinable(seq: Seq): boolean {
    return !!seq.gen && seq.gen.produced === 0 && !seq.joining && !seq.cancelled && seq.pending.length > 0 && seq.pending.length <= this.opts.prefillTokensPerStepMax;
  }

  /**
   * Sends a waiting generation's whole prompt to the worker to run between
   * two steps of the decode run in flight, which it then joins: an arrival
   * costs no interruption and no round trip between the threads.
   */
  private join(seq: Seq, onJoin: (s: Seq) => void): boolean {
    if (!this.joinable(seq)) return false;
    const w = this.waiting.indexOf(seq);
    if (w >= 0) {
      // First come, first served: a request behind others in the queue waits its turn.
      if (w > 0 || this.slotsUsed() >= this.opts.batchSizeMax) return false;
      this.unqueue(w);
      this.activate(seq);
    } else if (!this.active.has(seq)) return false;
    seq.joining = true;
    onJoin(seq);
    if (this.joinsToSend.push(seq) === 1) queueMicrotask(() => this.sendJoins());
    return true;
  }

  /**
   * Sends the joins made in this turn of the event loop together: as one message each group of
   * them that fits a step's prefill budget (rows x the longest row). The worker runs a message's
   * rows in one step: prompts that arrive together share it however the two threads interleave
   * (posted one by one, a step of a small model could start between two posts), and one post
   * costs what one does (~36 us) instead of one each.
   */
  private sendJoins(): void {
    const seqs = this.joinsToSend.splice(0).filter((s) => {
      if (!s.cancelled) return true;
      s.joining = false; // cancelled in the same turn: never sent, reaped as any other
      return false;
    });
    for (const group of inStepBudget(seqs, () => 1, (s) => s.pending.length, this.opts.prefillTokensPerStepMax)) this.sendJoin(group);
  }

  /** One join message: the prompts of `seqs`, answered (or failed) together. */
  private sendJoin(seqs: Seq[]): void {
    const counts = seqs.map((s) => s.pending.length);
    this.runner
      .join(seqs.map((s, b) => this.row(s, counts[b]!)))
      .then(({ tokens, logprobs, rowsInStep, missed }) => {
        // Joins that arrived together share a step (worker.ts runJoins): counted once, with all its rows.
        if (rowsInStep) M.batchSize.observe({ model: this.modelId, phase: 'prefill' }, rowsInStep);
        this.startedFromKept(seqs, { missed });
        seqs.forEach((seq, b) => {
          seq.joining = false;
          seq.pending.splice(0, counts[b]);
          if (!seq.cancelled) {
            M.promptTokens.inc(this.runner.labels, counts[b]!);
            this.accept(seq, tokens[b]!, logprobs?.[b]);
          }
        });
        if (!this.running) this.kick();
        // Sent to join a run that had ended in the worker before the prompt came, it ran there on its
        // own, and the run in flight now was planned without it: that run ends after its step, and
        // the next one takes it, instead of it idling for up to all of its steps (decodeRunStepsMax).
        else if (seqs.some((s) => !s.cancelled && s.joinedRun !== this.runId)) this.replan?.();
      })
      .catch((e) => {
        this.startedFromKept(seqs, undefined);
        for (const seq of seqs) {
          seq.joining = false;
          this.fail(seq, e);
        }
        if (!this.running) this.kick();
      });
  }

  /**
   * Admits a generation now (so a full queue is a 429 before any response
   * starts) and returns its event stream. The sequence is cancelled when the
   * stream is closed early, even before its first read, or the signal aborts.
   */
  generate(req: GenerateRequest): AsyncGenerator<GenerateEvent> {
    // The serving layer refuses these with the request's own field names (serving-checks.ts); here they are broken invariants.
    if (req.promptTokens.length === 0) throw new Error('generate: the prompt has no tokens');
    if (req.promptTokens.length + req.maxTokens > this.contextLength) {
      throw new Error(`generate: a prompt of ${req.promptTokens.length} tokens plus ${req.maxTokens} to generate exceeds the context length of ${this.contextLength}`);
    }
    const gen = new Generation(req, this.text, this.modelId);
    const seq: Seq = { id: this.nextSeq++, pending: [...req.promptTokens], promptLen: req.promptTokens.length, gen, cancelled: false };
    if (this.keptPrompts && req.shareScope !== undefined) this.startFromKept(seq, req.promptTokens, req.shareScope);
    const onAbort = () => this.cancel(seq);
    req.signal?.addEventListener('abort', onAbort);
    try {
      this.admit(seq);
    } catch (e) {
      req.signal?.removeEventListener('abort', onAbort);
      this.startedFromKept([seq], undefined);
      throw e;
    }
    return new EventStream(
      gen,
      () => {
        const wasPaused = this.paused(seq);
        const ev = gen.queue.shift()!;
        if (wasPaused) this.kick(); // the reader caught up: the sequence may decode again
        return ev;
      },
      () => {
        req.signal?.removeEventListener('abort', onAbort);
        if (!gen.finished) this.cancel(seq);
      },
    );
  }

  /**
   * Log-softmax at the last position of each branch; the prefix is prefilled once and forked.
   * The questions' shared lead (sharedLead) runs once, as part of the prefix's sequence. With a
   * `shareScope`, a job whose prefix (the same tokens, the same scope) is still waiting or
   * being prefilled for another job joins it instead of running it again, where every question
   * of it opens with that sequence's lead: 64 concurrent one-question requests on one state
   * prefill it once. Each job is billed what it would run alone (scoreTokens): what a request
   * costs does not depend on what else runs.
   */
  scoreBranches(prefixTokens: number[], branches: BranchSpec[], signal?: AbortSignal, shareScope?: string): Promise<{ logprobs: Float32Array[]; processedTokens: number }> {
    return new Promise((resolve, reject) => {
      if (prefixTokens.length === 0 || branches.length === 0 || branches.some((b, i) => b.tokens.length === 0 || b.parent >= i || b.parent < -1)) {
        reject(new Error('scoreBranches: the prefix and branches must be non-empty and parents listed before children'));
        return;
      }
      if (prefixTokens.length + Math.max(...branches.map((b) => this.depth(branches, b))) > this.contextLength) {
        // The evaluation planner lays out only what fits (evaluator/evaluate.ts): here it is a broken invariant.
        reject(new Error(`scoreBranches: the branches need more than the context length of ${this.contextLength} tokens`));
        return;
      }
      const children: number[][] = [[], ...branches.map(() => [] as number[])];
      branches.forEach((b, i) => children[b.parent + 1]!.push(i));
      const key = prefixKey(prefixTokens, shareScope);
      // Every question opens with the prefix sequence's lead, which its KV holds after the prefix.
      const fits = (p: Seq | undefined): p is Seq => p !== undefined && branches.every((b) => b.parent !== -1 || (b.tokens.length > p.prefixLead!.length && p.prefixLead!.every((x, i) => b.tokens[i] === x)));
      const running = key === undefined ? undefined : this.prefixes.get(key);
      const joins = fits(running) && !running.cancelled && running.prefixOf !== undefined;
      // A kept prefix serves any job of its key: from its end where the questions open with its
      // lead, else from the end of the state, before the lead (the questions then run all their tokens).
      const kept = joins || key === undefined ? undefined : this.kept.get(key);
      const reuses = kept !== undefined;
      const ownLead = sharedLead(branches);
      const prefix: Seq = joins
        ? running
        : reuses
          ? kept.seq
          : { id: this.nextSeq++, pending: [...prefixTokens, ...ownLead], promptLen: prefixTokens.length + ownLead.length, cancelled: false, prefixOf: [], prefixKey: key, prefixLead: ownLead };
      // The questions continue the prefix's sequence: its lead is run there, not in them.
      const strip = !reuses || fits(kept.seq) ? prefix.prefixLead!.length : 0;
      const job: ScoreJob = {
        branches: strip ? branches.map((b) => (b.parent === -1 ? { parent: -1, tokens: b.tokens.slice(strip) } : b)) : branches,
        children,
        logprobs: new Array(branches.length),
        left: branches.length,
        processed: scoreTokens(prefixTokens.length, branches, ownLead),
        resolve,
        reject,
        cancelled: false,
      };
      M.prefixQueries.inc(this.runner.labels, prefixTokens.length + ownLead.length);
      if (reuses) {
        M.prefixHits.inc(this.runner.labels, prefixTokens.length + strip);
        signal?.addEventListener(
          'abort',
          () => {
            job.cancelled = true; // its branches are reaped, or never forked
            job.reject(signal.reason);
          },
          { once: true },
        );
        void this.forkKept(key!, kept, job, prefixTokens.length + strip);
        return;
      }
      prefix.prefixOf!.push(job);
      signal?.addEventListener(
        'abort',
        () => {
          job.cancelled = true;
          // The caller's own reason (its deadline, its client gone) goes back to it as it was given.
          job.reject(signal.reason);
          // The prefix runs on while another job waits for it.
          const jobs = prefix.prefixOf;
          if (jobs?.includes(job)) jobs.splice(jobs.indexOf(job), 1);
          if (!jobs || jobs.length === 0) this.cancel(prefix);
        },
        { once: true },
      );
      if (joins) {
        M.prefixHits.inc(this.runner.labels, prefixTokens.length + strip);
        return;
      }
      // The prefix others may join: the first of its key still prefilling (one with another lead runs beside it).
      const held = key === undefined ? undefined : this.prefixes.get(key);
      if (key !== undefined && (!held || held.cancelled || !held.prefixOf)) this.prefixes.set(key, prefix);
      try {
        this.admit(prefix);
      } catch (e) {
        this.forgetPrefix(prefix);
        reject(e);
      }
    });
  }

  /**
   * A generation of `scope` whose prompt opens with the tokens of a kept generation of the same
   * scope (kept-prompts.ts), or of one still running whose prompt is in its cache, starts from a
   * copy of that cache: only the rest of its prompt runs. The copy is made in the worker with its
   * first prompt chunk (StepRow.from), so it waits for nothing. A running one is not held: if it
   * is gone by then (freed, not kept), the row runs those tokens itself and says so.
   */
  private startFromKept(seq: Seq, prompt: number[], scope: string): void {
    seq.scope = scope;
    seq.prompt = prompt;
    seq.sampled = [];
    M.prefixQueries.inc(this.runner.labels, prompt.length);
    const start = this.startingPoint(prompt, scope);
    let mine = this.liveByScope.get(scope);
    if (!mine) this.liveByScope.set(scope, (mine = new Set()));
    mine.add(seq);
    if (!start) return;
    if (start.kept) this.keptPrompts!.use(start.kept);
    seq.from = { seq: start.seq, tokens: prompt.slice(0, start.at), ...(start.kept ? { kept: start.kept } : {}) };
    seq.pending = prompt.slice(start.at);
  }

  /**
   * Where a prompt of `scope` would start: the generation of the scope, kept or still running,
   * that holds the longest of its opening, if that is worth starting from (kept-prompts.ts).
   */
  private startingPoint(prompt: number[], scope: string): { seq: number; at: number; kept?: KeptPrompt } | undefined {
    const found = this.keptPrompts?.best(scope, prompt);
    let start: { seq: number; at: number; kept?: KeptPrompt } | undefined = found && { seq: found.kept.seq, at: found.at, kept: found.kept };
    for (const o of this.liveByScope.get(scope) ?? []) {
      // Its prompt is in its cache once it has made a token (and it waits for no start of its own).
      if (o.cancelled || !o.gen || o.gen.produced === 0 || o.from) continue;
      const at = sharedOpening(o, prompt);
      if (at > (start?.at ?? 0) && worthStarting(at, prompt.length)) start = { seq: o.id, at };
    }
    return start;
  }

  /**
   * The step that carried these sequences' starts from kept generations (their first prompt chunk)
   * was answered (`answered.missed`: those whose generation had gone, whose opening the worker ran
   * at the head of the chunk), or failed or never ran (`answered` undefined): the kept ones may go again.
   */
  private startedFromKept(seqs: Seq[], answered: { missed?: number[] } | undefined): void {
    for (const s of seqs) {
      if (!s.from) continue;
      if (answered) {
        if (!answered.missed?.includes(s.id)) {
          M.prefixHits.inc(this.runner.labels, s.from.tokens.length);
          s.cached = s.from.tokens.length;
        }
        // Prompt tokens either way, as vLLM counts every prompt token and as the prompt is billed:
        // taken from the generation, or run (a missed fork). A cancelled one was billed already.
        if (!s.cancelled) M.promptTokens.inc(this.runner.labels, s.from.tokens.length);
      }
      if (s.from.kept) this.keptPrompts!.forked(s.from.kept);
      s.from = undefined;
    }
  }

  /** How many of `prompt`'s opening tokens a generation of `scope` holds here, kept or running (0: none): where a replica's next generation should go. */
  keptOpening(prompt: number[], scope?: string): number {
    return (scope !== undefined && this.startingPoint(prompt, scope)?.at) || 0;
  }

  /** A prompt chunk of `n` tokens of `s` as a step's row: with where its cache starts, on the first. */
  private row(s: Seq, n: number): StepRow {
    const r: StepRow = { seq: s.id, tokens: s.pending.slice(0, n), sampler: this.samplerFor(s, n) };
    if (s.from) r.from = { seq: s.from.seq, tokens: s.from.tokens };
    return r;
  }

  /**
   * A generation's worker sequence is done with: kept for later prompts of its user where it
   * finished (end of text, max_tokens, a stop string) and fits, else freed. Once.
   */
  private release(s: Seq): void {
    if (s.released) return;
    s.released = true;
    if (s.from) this.startedFromKept([s], undefined); // never sent: its kept generation may go
    const mine = s.scope === undefined ? undefined : this.liveByScope.get(s.scope);
    if (mine?.delete(s) && !mine.size) this.liveByScope.delete(s.scope!);
    const kp = this.keptPrompts;
    const keep = !!kp && !!s.gen?.finished && !s.cancelled && s.scope !== undefined && (s.sampled?.length ?? 0) > 0 && kp.add(s.id, s.scope, cachedTokens(s));
    this.toRelease(keep ? 'keep' : 'free', [s.id]);
  }

  /** Sends these keeps or frees at the end of this turn, with the turn's others: keeps first, so a sequence kept and evicted in one turn ends freed. */
  private toRelease(how: 'keep' | 'free', seqs: number[]): void {
    const { keep, free } = this.released;
    if (keep.length + free.length === 0) {
      queueMicrotask(() => {
        if (keep.length) this.runner.keep(keep.splice(0));
        if (free.length) this.runner.free(free.splice(0));
      });
    }
    this.released[how].push(...seqs);
  }

  /** Whether a job of this prefix and scope would find it here, prefilling or kept: where a replica's next job should go. */
  holdsPrefix(prefixTokens: number[], shareScope?: string): boolean {
    const key = prefixKey(prefixTokens, shareScope);
    return key !== undefined && (this.prefixes.has(key) || this.kept.has(key));
  }

  /** A job's questions forked from a kept prefix's first `at` positions (its most recent use now), then run by the loop. */
  private async forkKept(key: string, kept: KeptPrefix, job: ScoreJob, at: number): Promise<void> {
    this.kept.delete(key);
    this.kept.set(key, kept);
    kept.forking++;
    try {
      await this.forkBranches(kept.seq, job, job.children[0]!, at);
    } catch (e) {
      job.reject(new EngineFailed(failureOf(e, this.modelId)));
      return;
    } finally {
      kept.forking--;
      this.trimKept();
    }
    this.kick();
  }

  /** Keeps a prefilled prefix whose jobs forked for later jobs of its key, when it fits the budget at all. */
  private keep(seq: Seq): void {
    const key = seq.prefixKey;
    const bytes = keptPrefixBytes(seq.promptLen, this.runner.arch);
    if (key === undefined || seq.cancelled || bytes > this.opts.prefixCacheBytesMax) return;
    const old = this.kept.get(key);
    if (old?.forking) return; // the same state again, prefilled beside the kept one (concurrent jobs), which is being forked from: it stays
    if (old) this.dropKept(key, old); // the same state again, prefilled beside the kept one: the newer one stays
    this.active.delete(seq); // not reaped: kept
    this.kept.set(key, { seq, bytes, forking: 0 });
    this.keptBytes += bytes;
    this.trimKept();
  }

  /** Frees the least recently used kept prefixes until the rest fit the budget (not those with forks in flight). */
  private trimKept(): void {
    for (const [key, k] of this.kept) {
      if (this.keptBytes <= this.opts.prefixCacheBytesMax) return;
      this.dropKept(key, k);
    }
  }

  /** Frees a kept prefix, unless forks from it are in flight. */
  private dropKept(key: string, k: KeptPrefix): void {
    if (k.forking > 0) return;
    this.kept.delete(key);
    this.keptBytes -= k.bytes;
    this.runner.free([k.seq.id]);
  }

  /** No job joins this prefix from now on (it is prefilled, failed or gone). */
  private forgetPrefix(s: Seq): void {
    if (s.prefixKey !== undefined && this.prefixes.get(s.prefixKey) === s) this.prefixes.delete(s.prefixKey);
  }

  private depth(branches: BranchSpec[], b: BranchSpec): number {
    let n = 0;
    for (let x: BranchSpec | undefined = b; x; x = x.parent >= 0 ? branches[x.parent] : undefined) n += x.tokens.length;
    return n;
  }

  /** Ends a generation once: a final event for its reader and its usage for billing (output.ts). */
  private end(s: Seq, finishReason: 'stop' | 'length' | 'cancelled' | 'failed', failure?: EngineFailure): void {
    const g = s.gen!;
    if (g.finished) return;
    this.completions.note();
    // A prompt cut short is billed for what ran of it (a start from a kept generation not yet made: none of it); one that made a token, whole.
    const ran = s.promptLen - s.pending.length - (s.from?.tokens.length ?? 0);
    g.end(finishReason, { inputTokens: g.produced > 0 ? s.promptLen : ran, outputTokens: g.produced, ...(s.cached ? { cachedInputTokens: s.cached } : {}) }, failure);
  }

  private paused(seq: Seq): boolean {
    return !!seq.gen && seq.gen.queue.length >= this.opts.pendingTokensMax;
  }

  private cancel(seq: Seq): void {
    if (seq.cancelled) return;
    if (seq.gen) this.end(seq, 'cancelled');
    seq.cancelled = true;
    const w = this.waiting.indexOf(seq);
    if (w >= 0) {
      this.unqueue(w);
      if (seq.gen) this.release(seq); // never ran: only its hold on a kept generation to let go
    }
    this.kick();
  }

  private kick(now = false): void {
    if (this.running) {
      this.replan?.(); // a decode run in flight ends after its step, so the loop looks again
      return;
    }
    this.running = true;
    if (now) void this.loop();
    else setImmediate(() => void this.loop());
  }

  private async loop(): Promise<void> {
    try {
      while (true) {
        this.reap();
        while (this.waiting.length && this.slotsUsed() < this.opts.batchSizeMax) this.activate(this.unqueue(0));
        M.waiting.set(this.runner.labels, this.waiting.length);
        M.running.set(this.runner.labels, this.slotsUsed());
        this.reportKvUsage();
        const decoding = [...this.active].filter((s) => s.gen && !s.gen.finished && s.pending.length === 1 && s.gen.produced > 0 && !this.paused(s));
        const prefilling = [...this.active].filter((s) => s.pending.length > 0 && !s.joining && !(s.gen && s.gen.produced > 0));
        if (!decoding.length && !prefilling.length) break;
        // Prompts that fit a step join the decode run (the worker runs them between two of its
        // steps, those that came together in one step); only the others (long prompts in chunks,
        // evaluations) take turns with it. Before, any waiting prompt cut the run to one step and
        // ran alone: at 16 streams most prompts arrived then, one at a time (bench/README.md
        // "Prompts join the decode run").
        const joining: Seq[] = [];
        const others: Seq[] = [];
        for (const s of prefilling) (decoding.length && this.joinable(s) ? joining : others).push(s);
        const decode = decoding.length > 0 && (!others.length || !this.lastWasDecode);
        this.lastWasDecode = decode;
        const budget = decoding.length ? this.opts.prefillTokensPerStepMax : this.opts.prefillTokensPerIdleStepMax;
        await (decode ? this.decodeRun(decoding, others.length > 0, joining) : this.prefillStep(prefilling, budget));
      }
    } catch (e) {
      // A closed runner is the engine shutting down, not a fault: its sequences are told so.
      if (!(e instanceof RunnerClosed)) log.error({ err: e, model: this.modelId }, 'scheduler step failed');
      for (const s of this.active) this.fail(s, e);
    } finally {
      this.running = false;
      this.replan = undefined;
      this.joinRun = undefined;
      this.reap();
      M.running.set(this.runner.labels, this.slotsUsed());
      M.kvBytes.set(this.runner.labels, this.runner.kvBytes);
      this.reportKvUsage();
      if ([...this.active].some((s) => s.pending.length > 0 && !s.joining && !this.paused(s)) || (this.waiting.length && this.slotsUsed() < this.opts.batchSizeMax)) this.kick();
    }
  }

  /** Drops cancelled and finished sequences and frees their KV in the worker. */
  private reap(): void {
    const gone: number[] = [];
    for (const s of this.active) {
      const done = s.branch === undefined && s.gen === undefined && s.prefixOf === undefined;
      if (s.cancelled || (s.gen?.finished ?? false) || (s.branch?.job.cancelled ?? false) || done) {
        this.active.delete(s);
        this.forgetPrefix(s);
        if (s.gen) this.release(s);
        else gone.push(s.id);
      }
    }
    this.runner.free(gone);
  }

  /** Ends a sequence the engine cannot go on with: a generation reports `failed`, a scoring job rejects. */
  private fail(s: Seq, e: unknown): void {
    const failure = failureOf(e, this.modelId);
    if (s.gen) this.end(s, 'failed', failure);
    for (const job of s.prefixOf ?? (s.branch ? [s.branch.job] : [])) job.reject(new EngineFailed(failure));
    this.forgetPrefix(s);
    s.cancelled = true;
  }

  /** The worker died: every sequence it held is gone with its KV cache; the waiting ones run on the new one. */
  workerLost(e: WorkerLost): void {
    for (const s of this.active) this.fail(s, e);
    // Their caches went with the worker.
    this.kept.clear();
    this.keptBytes = 0;
    this.keptPrompts?.clear();
    this.kick();
  }

  private async prefillStep(all: Seq[], budget: number): Promise<void> {
    // Shortest remaining first packs more rows under the budget and finishes prompts sooner.
    all.sort((a, b) => a.pending.length - b.pending.length);
    // Branches of one evaluation step alone, so the worker feeds their shared prefix once
    // (and a request's answers do not depend on what else was queued with it). Branch
    // steps and prompt steps take turns, so a stream of short evaluations never holds
    // a prompt back for more than one step.
    const prompts = all.some((s) => !s.branch);
    const first = this.lastPrefillWasBranches && prompts ? all.find((s) => !s.branch)! : all[0]!;
    const job = first.branch?.job;
    this.lastPrefillWasBranches = job !== undefined;
    const cands = all.filter((s) => s.branch?.job === job);
    const rows: Array<{ seq: Seq; n: number }> = [];
    let width = 0;
    for (const s of cands) {
      const n = Math.min(s.pending.length, budget);
      const w = Math.max(width, n);
      if (rows.length && (rows.length + 1) * w > budget) break;
      rows.push({ seq: s, n });
      width = w;
    }
    M.batchSize.observe({ model: this.modelId, phase: 'prefill' }, rows.length);
    let answer;
    const t0 = performance.now();
    try {
      answer = await this.runner.step(rows.map((r) => this.row(r.seq, r.n)));
      this.pace.prompt(rows.reduce((n, r) => n + r.n, 0), performance.now() - t0);
    } catch (e) {
      this.startedFromKept(rows.map((r) => r.seq), undefined);
      throw e;
    }
    const { logits, tokens, logprobs, missed } = answer;
    this.startedFromKept(rows.map((r) => r.seq), { missed });
    for (let b = 0; b < rows.length; b++) {
      const { seq, n } = rows[b]!;
      seq.pending.splice(0, n);
      // Counted per chunk: a prompt cancelled half-way was half run, and is billed so.
      if (!seq.cancelled) M.promptTokens.inc(this.runner.labels, n);
      if (seq.pending.length > 0 || seq.cancelled) continue;
      if (seq.gen) {
        this.accept(seq, tokens[b]!, logprobs?.[b]);
      } else if (seq.branch) {
        const { job, index } = seq.branch;
        job.logprobs[index] = logSoftmax(logits, b * this.vocab, this.vocab);
        await this.forkBranches(seq, job, job.children[index + 1]!);
        seq.branch = undefined; // done: reaped next
        if (--job.left === 0) {
          this.completions.note();
          job.resolve({ logprobs: job.logprobs, processedTokens: job.processed });
        }
      } else if (seq.prefixOf) {
        this.forgetPrefix(seq); // prefilled: a job that comes now runs its own
        for (const job of seq.prefixOf) await this.forkBranches(seq, job, job.children[0]!);
        seq.prefixOf = undefined; // its KV is shared by the branches: reaped next, unless kept
        this.keep(seq);
      }
    }
  }

  /** A generation whose prompt ends with this chunk is sampled by the worker from here on. */
  private samplerFor(s: Seq, n: number): SamplerSpec | undefined {
    const g = s.gen;
    if (!g || n < s.pending.length) return undefined;
    return {
      temperature: g.req.temperature,
      topP: g.req.topP,
      seed: g.seed,
      budget: g.req.maxTokens,
      eos: [...this.text.eosIds],
      cuts: g.req.cuts,
      adjust: g.req.adjust,
      topLogprobs: g.req.topLogprobs,
      grammar: g.req.grammar,
      ...(s.scope !== undefined && this.keptPrompts ? { keep: true } : {}),
    };
  }

  /** Starts the given branches from `from`'s KV cache, its first `at` positions or all of them (shared, not copied). */
  private async forkBranches(from: Seq, job: ScoreJob, indices: number[], at?: number): Promise<void> {
    if (indices.length === 0 || job.cancelled) return;
    const ids = indices.map(() => this.nextSeq++);
    await this.runner.fork(from.id, ids, at);
    indices.forEach((index, k) => {
      const tokens = job.branches[index]!.tokens;
      this.active.add({ id: ids[k]!, pending: [...tokens], promptLen: tokens.length, branch: { job, index }, cancelled: false });
    });
  }

  /**
   * A decode run: the worker steps these sequences on its own and sends each
   * step's tokens (a few fast steps together: token-posts.ts), which become
   * text and events here as they arrive. The run
   * is interrupted (it ends after the worker's current step) when the batch
   * should change: a prompt to prefill, a new request, a reader that stopped
   * reading or caught up, a cancellation. Sequences that end here (a stop
   * string, a cancelled stream) are freed in the worker at its next step.
   */
  private async decodeRun(rows: Seq[], prefillWaiting: boolean, joining: Seq[] = []): Promise<void> {
    const byId = new Map(rows.map((s) => [s.id, s]));
    let interrupted = false;
    const interrupt = () => {
      if (interrupted) return;
      interrupted = true;
      this.runner.interrupt();
    };
    const dropped = new Set<number>();
    let steps = 0;
    const runId = ++this.runId;
    this.replan = interrupt;
    this.joinRun = (seq) =>
      this.join(seq, (s) => {
        rows.push(s);
        byId.set(s.id, s);
        s.joinedRun = runId;
      });
    try {
      const run = this.runner.decode(rows.map((s) => s.id), this.opts.decodeRunStepsMax, (seqs, tokens, logprobs, madeAt, stepMs) => {
        steps++;
        M.batchSize.observe({ model: this.modelId, phase: 'decode' }, seqs.length);
        const drop: Seq[] = [];
        let positions = 0;
        for (let b = 0; b < seqs.length; b++) {
          const s = byId.get(seqs[b]!);
          if (!s || dropped.has(s.id)) continue;
          const g = s.gen!;
          positions += s.promptLen + g.produced;
          if (!s.cancelled && !g.finished) {
            s.pending = [];
            this.accept(s, tokens[b]!, logprobs?.[b], madeAt);
          }
          // Ended here while the worker would go on: free (or keep) it there (the token it may still make is never counted).
          if ((s.cancelled || g.finished) && !this.endedInWorker(s, tokens[b]!)) {
            dropped.add(s.id);
            drop.push(s);
          }
        }
        this.pace.decode(seqs.length, positions, stepMs);
        for (const s of drop) this.release(s);
        if (this.waiting.length) this.fillFreedSlots();
        if (rows.some((s) => !dropped.has(s.id) && !s.gen!.finished && this.paused(s))) interrupt();
      });
      // After the decode message: the worker is in the run when these arrive, so they join it.
      for (const s of joining) this.joinRun(s);
      if (prefillWaiting) interrupt(); // one step, then the waiting prompt
      await run;
      // The worker ends a sequence by the same rules as accept(); a run that stepped nothing would loop forever.
      if (steps === 0 && !interrupted) throw new Error(`decode run of ${rows.length} sequences made no step`);
    } finally {
      this.replan = undefined;
      this.joinRun = undefined;
    }
  }

  /**
   * Slots that came free in the decode run in flight (its generations that ended) go to the
   * queue's head, which joins the run; a head that cannot join (a long prompt, an evaluation)
   * ends the run after its step, so the loop starts it.
   */
  private fillFreedSlots(): void {
    while (this.waiting.length && this.slotsUsed() < this.opts.batchSizeMax) {
      if (!this.joinRun?.(this.waiting[0]!)) return this.replan?.();
    }
  }

  /** Whether the worker stopped this sequence by itself after `tok`: end of text, or max_tokens reached. */
  private endedInWorker(s: Seq, tok: number): boolean {
    return endsGeneration(tok, s.gen!.produced, s.gen!.req.maxTokens, this.text.eosIds);
  }

  /**
   * Counts a token sampled by the worker and delivers it (output.ts). The sequence goes
   * on with it unless it ends the sequence by itself (end of text, max_tokens).
   */
  private accept(s: Seq, tok: number, lp?: TokenLogprob | null, madeAt?: number): void {
    s.sampled?.push(tok);
    const r = s.gen!.accept(tok, lp ?? undefined, madeAt);
    if (r.goesOn) s.pending = [tok];
    if (r.finish) {
      this.end(s, r.finish);
      // Now, not at the next reap: its reader may send the conversation's next turn as soon as it reads the end.
      if (s.scope !== undefined) this.release(s);
    }
  }
}

/** Whether a sequence holds a batch slot (Scheduler.slotsUsed says when). */
const holdsSlot = (s: Seq): boolean => (s.gen !== undefined && !s.gen.finished) || s.prefixOf !== undefined;

/** What a kept prefix of `positions` holds: its cache, and the branch graph's copy of it (worker.ts prefixFeeds). */
export function keptPrefixBytes(positions: number, layout: KvLayout): number {
  return 2 * positions * kvBytesPerPosition(layout);
}

/** What a generation's cache holds for sure: its prompt and each sampled token that a later step fed back. */
function cachedTokens(s: Seq): number[] {
  return [...s.prompt!, ...s.sampled!.slice(0, -1)];
}

/** How many of `prompt`'s tokens, short of its last, open like `s`'s cache (cachedTokens), read where they lie: every new prompt of a user reads each of the user's running generations. */
function sharedOpening(s: Seq, prompt: readonly number[]): number {
  const inPrompt = commonOpening(s.prompt!, prompt, prompt.length - 1);
  if (inPrompt < s.prompt!.length) return inPrompt;
  const fed = Math.min(s.sampled!.length - 1, prompt.length - 1 - inPrompt);
  let i = 0;
  while (i < fed && s.sampled![i] === prompt[inPrompt + i]) i++;
  return inPrompt + i;
}

/** A prefix's key for sharing (Scheduler.prefixes, Scheduler.kept): its scope and tokens; none without a scope. */
function prefixKey(prefixTokens: number[], shareScope: string | undefined): string | undefined {
  return shareScope === undefined ? undefined : `${shareScope}\u0000${prefixTokens.join(',')}`;
}

/** What a sequence's reader is told when the engine cannot go on with it. */
function failureOf(e: unknown, modelId: string): EngineFailure {
  return e instanceof RunnerClosed
    ? { message: `model ${modelId} is shutting down; retry on another replica`, retryable: true, shuttingDown: true }
    : e instanceof WorkerLost
      ? { message: `model ${modelId}'s worker stopped while running this request; it is restarting, retry shortly`, retryable: true }
      : { message: `model ${modelId} failed while running this request`, retryable: false };
}
