import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { narrowSessionFor, threadsFor } from './engine.js';

describe('threadsFor (ORT_INTRA_OP_THREADS unset)', () => {
  it('gives a tiny model one thread and any other every core, counting its external data', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-threads-'));
    try {
      const file = path.join(dir, 'model.onnx');
      fs.writeFileSync(file, Buffer.alloc(1024));
      expect(threadsFor(file)).toBe(1);
      fs.truncateSync(file, 5 * 2 ** 20);
      expect(threadsFor(file)).toBe(os.availableParallelism());
      fs.truncateSync(file, 1024);
      fs.writeFileSync(`${file}.data`, Buffer.alloc(0));
      fs.truncateSync(`${file}.data`, 8 * 2 ** 20);
      expect(threadsFor(file)).toBe(os.availableParallelism());
      fs.rmSync(`${file}.data`);
      expect(threadsFor(file)).toBe(1);
      fs.writeFileSync(`${file}_data`, Buffer.alloc(0));
      fs.truncateSync(`${file}_data`, 8 * 2 ** 20);
      expect(threadsFor(file)).toBe(os.availableParallelism());
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('narrowSessionFor', () => {
  it('gives a model on several threads a one-thread session too, unless its weights are over 256 MiB', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-threads-'));
    try {
      const file = path.join(dir, 'model.onnx');
      fs.writeFileSync(file, Buffer.alloc(0));
      fs.truncateSync(file, 18 * 2 ** 20);
      expect(narrowSessionFor(file, 2)).toBe(true);
      expect(narrowSessionFor(file, 1)).toBe(false); // one thread already
      fs.writeFileSync(`${file}.data`, Buffer.alloc(0));
      fs.truncateSync(`${file}.data`, 300 * 2 ** 20);
      expect(narrowSessionFor(file, 2)).toBe(false);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
