import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { extraSessionsFor, keptBytesAtLoad, memoryForModels, threadsFor } from './engine.js';

/** Runs `fn` with a model file path in a fresh folder; `size` sets a file's size (sparse). */
function withModelDir(fn: (file: string, size: (f: string, bytes: number) => void) => void): void {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-threads-'));
  const size = (f: string, bytes: number) => {
    fs.writeFileSync(f, Buffer.alloc(0));
    fs.truncateSync(f, bytes);
  };
  try {
    fn(path.join(dir, 'model.onnx'), size);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

describe('threadsFor (ORT_INTRA_OP_THREADS unset)', () => {
  it('gives a tiny model one thread and any other every core, counting its external data', () =>
    withModelDir((file, size) => {
      size(file, 1024);
      expect(threadsFor(file)).toBe(1);
      size(file, 5 * 2 ** 20);
      expect(threadsFor(file)).toBe(os.availableParallelism());
      size(file, 1024);
      size(`${file}.data`, 8 * 2 ** 20);
      expect(threadsFor(file)).toBe(os.availableParallelism());
      fs.rmSync(`${file}.data`);
      expect(threadsFor(file)).toBe(1);
      size(`${file}_data`, 8 * 2 ** 20);
      expect(threadsFor(file)).toBe(os.availableParallelism());
    }));
});

describe('extraSessionsFor', () => {
  const allow = { narrow: true, spinning: true, prefill: true, spin: 'off' } as const;
  it('gives a model on several threads a one-thread and a spinning session too, unless its weights are over 256 MiB', () =>
    withModelDir((file, size) => {
      size(file, 18 * 2 ** 20);
      expect(extraSessionsFor(file, 2, 'fp32', allow)).toEqual({ narrow: true, spinning: true, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false });
      expect(extraSessionsFor(file, 1, 'fp32', allow)).toEqual({ narrow: false, spinning: false, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false }); // one thread already
      size(`${file}.data`, 300 * 2 ** 20);
      expect(extraSessionsFor(file, 2, 'fp32', allow)).toEqual({ narrow: false, spinning: false, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false });
    }));
  it('gives a block-quantized variant (int8, q4) a prefill session on any number of threads, past 256 MiB of weights only where its memory fits', () =>
    withModelDir((file, size) => {
      size(file, 18 * 2 ** 20);
      expect(extraSessionsFor(file, 2, 'q4', allow)).toEqual({ narrow: true, spinning: true, prefill: true, prefillSpinning: true, prefillNarrow: true, long: true });
      expect(extraSessionsFor(file, 1, 'q4f16', allow)).toEqual({ narrow: false, spinning: false, prefill: true, prefillSpinning: false, prefillNarrow: true, long: true });
      expect(extraSessionsFor(file, 1, 'int8', allow).prefill).toBe(true);
      expect(extraSessionsFor(file, 2, 'uint8', allow).prefill).toBe(false); // onnxruntime's own integer products already
      expect(extraSessionsFor(file, 1, 'q4', { ...allow, prefill: false }).prefill).toBe(false);
      // the spinning twin of the prefill graph only where both the spinning and the prefill sessions load
      expect(extraSessionsFor(file, 2, 'q4', { ...allow, spinning: false }).prefillSpinning).toBe(false);
      expect(extraSessionsFor(file, 2, 'q4', { ...allow, prefill: false }).prefillSpinning).toBe(false);
      // the long-step session (its attention in pieces) only with the prefill graph, and as ORT_LONG_STEP_SESSION allows
      expect(extraSessionsFor(file, 2, 'q4', { ...allow, prefill: false }).long).toBe(false);
      expect(extraSessionsFor(file, 2, 'q4', { ...allow, long: false }).long).toBe(false);
      expect(extraSessionsFor(file, 2, 'q4', { ...allow, long: false }).prefill).toBe(true);
      // Past 256 MiB: where five times the files fit in a quarter of the memory, no copy on one thread (prefillNarrow)
      size(`${file}.data`, 300 * 2 ** 20);
      expect(extraSessionsFor(file, 2, 'q4', allow, { memory: 8 * 2 ** 30 })).toEqual({ narrow: false, spinning: false, prefill: true, prefillSpinning: false, prefillNarrow: false, long: false });
      expect(extraSessionsFor(file, 2, 'q4', allow, { memory: 4 * 2 ** 30 }).prefill).toBe(false);
      // an evaluation model's branch graph gets one too: twice the memory
      expect(extraSessionsFor(file, 2, 'q4', allow, { memory: 8 * 2 ** 30, graphs: 2 }).prefill).toBe(false);
      expect(extraSessionsFor(file, 2, 'q4', allow, { memory: 16 * 2 ** 30, graphs: 2 }).prefill).toBe(true);
      expect(extraSessionsFor(file, 2, 'q4', { ...allow, prefill: false }, { memory: 8 * 2 ** 30 }).prefill).toBe(false);
      // Past 1 GiB its graph would pass protobuf's 2 GiB, whatever the memory
      size(`${file}.data`, 1100 * 2 ** 20);
      expect(extraSessionsFor(file, 2, 'q4', allow, { memory: 2 ** 40 }).prefill).toBe(false);
    }));
  it('takes a chat model\'s kept-generations budget at load up to an eighth of the memory', () => {
    expect(keptBytesAtLoad(256 * 2 ** 20, 4 * 2 ** 30)).toBe(256 * 2 ** 20);
    expect(keptBytesAtLoad(2 ** 40, 4 * 2 ** 30)).toBe(512 * 2 ** 20);
    expect(keptBytesAtLoad(256 * 2 ** 20, 2 ** 30)).toBe(128 * 2 ** 20);
    expect(keptBytesAtLoad(0, 2 ** 30)).toBe(0);
  });
  it('takes the memory a container bounds the process to, or the machine\'s', () => {
    const bound = vi.spyOn(process, 'constrainedMemory');
    try {
      bound.mockReturnValue(2 ** 30);
      expect(memoryForModels()).toBe(2 ** 30);
      // No bound: Node answers 2^64 (or undefined in some versions)
      bound.mockReturnValue(2 ** 64);
      expect(memoryForModels()).toBe(os.totalmem());
      bound.mockReturnValue(undefined as unknown as number);
      expect(memoryForModels()).toBe(os.totalmem());
    } finally {
      bound.mockRestore();
    }
  });
  it('loads each only where its setting allows, and no spinning one where the every-core session spins already', () =>
    withModelDir((file, size) => {
      size(file, 18 * 2 ** 20);
      expect(extraSessionsFor(file, 2, 'fp32', { ...allow, narrow: false })).toEqual({ narrow: false, spinning: true, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false });
      expect(extraSessionsFor(file, 2, 'fp32', { ...allow, spinning: false })).toEqual({ narrow: true, spinning: false, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false });
      expect(extraSessionsFor(file, 2, 'fp32', { ...allow, spin: 'run' })).toEqual({ narrow: true, spinning: false, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false });
      expect(extraSessionsFor(file, 2, 'fp32', { ...allow, spin: 'always' })).toEqual({ narrow: true, spinning: false, prefill: false, prefillSpinning: false, prefillNarrow: false, long: false });
    }));
});
