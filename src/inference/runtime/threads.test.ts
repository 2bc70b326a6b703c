import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { narrowSessionFor, threadsFor } from './engine.js';

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

describe('narrowSessionFor', () => {
  it('gives a model on several threads a one-thread session too, unless its weights are over 256 MiB', () =>
    withModelDir((file, size) => {
      size(file, 18 * 2 ** 20);
      expect(narrowSessionFor(file, 2)).toBe(true);
      expect(narrowSessionFor(file, 1)).toBe(false); // one thread already
      size(`${file}.data`, 300 * 2 ** 20);
      expect(narrowSessionFor(file, 2)).toBe(false);
    }));
});
