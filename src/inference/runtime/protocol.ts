// Messages between a model's scheduler (main thread) and its worker thread.
// The worker owns the ONNX session and every sequence's KV cache, so a step
// sends only token ids and receives only last-position logits.

export interface InitMsg {
  type: 'init';
  modelPath: string;
  executionProvider: 'cpu' | 'webgpu' | 'cuda';
  strict: boolean;
  intraOpThreads: number;
}

export interface Arch {
  layers: number;
  kvHeads: number;
  headDim: number;
  kvType: 'float32' | 'float16';
  logitsType: 'float32' | 'float16';
  vocab: number;
  hasPositionIds: boolean;
  provider: string;
}

export interface StepRow {
  seq: number;
  tokens: number[];
}

export type Request =
  | InitMsg
  | { type: 'step'; id: number; rows: StepRow[] }
  | { type: 'fork'; id: number; from: number; to: number[] }
  | { type: 'free'; seqs: number[] }
  | { type: 'close'; id: number };

export type Reply =
  | { type: 'ready'; arch: Arch }
  | { type: 'init-error'; message: string }
  | { type: 'step'; id: number; logits: Float32Array; kvBytes: number }
  | { type: 'done'; id: number }
  | { type: 'error'; id: number; message: string };
