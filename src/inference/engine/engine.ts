import { ApiError } from '../../errors.js';
import { log } from '../../log.js';
import type { ChatMessage, GenerateEvent, GenerateRequest, ServedModel } from '../engine-api.js';
import type { InferenceEngine } from '../routes.js';
import { defaultRuntimeOptions, defaultSchedulerOptions, type RuntimeOptions, type SchedulerOptions } from './options.js';
import { loadModel, scanModels, type LoadedModel } from './registry.js';
import { Scheduler, type ScoreRequest, type ScoreResult } from './scheduler.js';

// The engine facade the inference routes use (InferenceEngine of routes.ts):
// the registry's models, each with its worker and its scheduler.

export interface EngineLoadOptions extends Partial<RuntimeOptions> {
  modelsDir: string;
  /** Scheduler limits (options.ts has the defaults and why). */
  options?: Partial<SchedulerOptions>;
}

interface Served extends LoadedModel {
  scheduler: Scheduler;
}

export class Engine implements InferenceEngine {
  private closed = false;

  private constructor(private readonly models: Map<string, Served>) {}

  /** Loads every model folder of `modelsDir` (broken ones are skipped with a log line). */
  static async load(o: EngineLoadOptions): Promise<Engine> {
    const runtime: RuntimeOptions = {
      executionProvider: o.executionProvider ?? defaultRuntimeOptions.executionProvider,
      executionProviderStrict: o.executionProviderStrict ?? defaultRuntimeOptions.executionProviderStrict,
      intraOpThreads: o.intraOpThreads ?? defaultRuntimeOptions.intraOpThreads,
    };
    const sched: SchedulerOptions = { ...defaultSchedulerOptions, ...o.options };
    const { found, skipped } = scanModels(o.modelsDir);
    for (const s of skipped) log.error({ dir: s.dir, reason: s.reason }, 'model folder skipped');
    const models = new Map<string, Served>();
    for (const f of found) {
      try {
        const m = await loadModel(f, runtime, sched);
        models.set(m.info.id, { ...m, scheduler: new Scheduler(m.info.id, m.worker, m.tokenizer, sched, m.info.contextLength) });
      } catch (e) {
        log.error({ dir: f.dir, model: f.info.id, err: e }, 'model folder skipped');
      }
    }
    return new Engine(models);
  }

  private get(id: string): Served {
    const m = this.models.get(id);
    if (!m) throw new ApiError('not_found', `model ${JSON.stringify(id)} does not exist`, { param: 'model', code: 'model_not_found' });
    if (this.closed) throw new ApiError('unavailable', 'the engine is shutting down');
    return m;
  }

  list(): ServedModel[] {
    return [...this.models.values()].map((m) => m.info);
  }

  model(id: string): ServedModel | undefined {
    return this.models.get(id)?.info;
  }

  /** Facts read from the model's graph (layers, KV heads, head size, KV type, vocabulary, provider). */
  arch(id: string) {
    return this.get(id).worker.arch;
  }

  encodeChat(modelId: string, messages: ChatMessage[]): number[] {
    return this.get(modelId).tokenizer.encodeChat(messages);
  }

  encode(modelId: string, text: string): number[] {
    return this.get(modelId).tokenizer.encode(text);
  }

  decode(modelId: string, ids: number[]): string {
    return this.get(modelId).tokenizer.decode(ids);
  }

  bosTokens(modelId: string): number[] {
    return this.get(modelId).tokenizer.bosTokens();
  }

  /** Streams a completion; throws at once (before any event) for a full queue or a too-long prompt. */
  generate(modelId: string, req: GenerateRequest): AsyncGenerator<GenerateEvent> {
    return this.get(modelId).scheduler.generate(req);
  }

  /** Log-softmax at the last position of each branch, every branch continuing one prefilled prefix. */
  scoreBranches(modelId: string, req: ScoreRequest): Promise<ScoreResult> {
    try {
      return this.get(modelId).scheduler.scoreBranches(req);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** Step counters of a model's scheduler since the last call with reset (profiling, tests). */
  stats(modelId: string, reset = false) {
    const sch = this.get(modelId).scheduler;
    return reset ? sch.resetStats() : { ...sch.stats, modes: { ...sch.stats.modes } };
  }

  /** Running and waiting counts of a model's scheduler. */
  load(modelId: string): { running: number; waiting: number } {
    return this.get(modelId).scheduler.load;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const m of this.models.values()) m.scheduler.close();
    await Promise.all([...this.models.values()].map((m) => m.worker.close()));
  }
}
