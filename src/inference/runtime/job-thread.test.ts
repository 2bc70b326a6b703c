import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

// A job thread must never keep a process alive once its work is done (scripts and
// benchmarks that tokenise exit on their own). Run in a child process: the built
// tokenizer thread, as `npm test` builds it first, on the default random model.
const dist = path.resolve(import.meta.dirname, '../../../dist/src/inference/runtime/tokenize-thread.js');
const dir = path.resolve(import.meta.dirname, '../../../models/random-llama');
const EXIT_WAIT_MS = 15_000; // a thread start and one encode take well under a second

describe('JobThread', () => {
  it('answers a job, then lets a finished process exit (the worker is referenced only while a job is out)', async () => {
    const script = `import { tokenizeThread } from ${JSON.stringify(dist)};
const ids = await tokenizeThread.encode(${JSON.stringify(dir)}, 'Once upon a time');
console.log(ids.length);`;
    // A file, not -e: the worker would inherit --input-type.
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-job-')), 'encode.mjs');
    fs.writeFileSync(file, script);
    try {
      const r = await promisify(execFile)(process.execPath, [file], { timeout: EXIT_WAIT_MS });
      expect(Number(r.stdout.trim())).toBeGreaterThan(0);
    } finally {
      fs.rmSync(path.dirname(file), { recursive: true, force: true });
    }
  });
});
