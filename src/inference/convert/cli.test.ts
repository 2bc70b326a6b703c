import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';

// The converter's command line as users run it (the built dist/, as `npm test` builds it first).
// Dimensions are multiples of 256, so no block size pads and file sizes follow the scale count.
const cli = path.resolve(import.meta.dirname, '../../../dist/src/inference/convert/cli.js');
const run = promisify(execFile);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-cli-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

const TINY = ['--dim', '256', '--hidden', '768', '--layers', '2', '--heads', '8', '--kv-heads', '4', '--vocab', '512', '--seq-len', '64'];

async function generate(name: string, ...extra: string[]): Promise<{ code: number; stderr: string; dir: string }> {
  const dir = path.join(tmp, name);
  try {
    await run(process.execPath, [cli, 'generate', dir, ...TINY, ...extra]);
    return { code: 0, stderr: '', dir };
  } catch (e) {
    const err = e as { code: number; stderr: string };
    return { code: err.code, stderr: err.stderr, dir };
  }
}

describe('converter --quant-block', () => {
  it('writes int8 with fewer block scales as the block grows (32 > the default 64 > 128 in bytes)', async () => {
    const size = async (name: string, ...block: string[]) => {
      const r = await generate(name, '--weights', 'int8', ...block);
      expect(r.code, r.stderr).toBe(0);
      return fs.statSync(path.join(r.dir, 'model_int8.onnx')).size;
    };
    const [b32, def, b128] = [await size('b32', '--quant-block', '32'), await size('default'), await size('b128', '--quant-block', '128')];
    expect(b32).toBeGreaterThan(def);
    expect(def).toBeGreaterThan(b128);
  });

  it('refuses a block MLAS has no kernel for, and a block with no quantized weights to apply to, naming flag, rule and value', async () => {
    const odd = await generate('odd', '--weights', 'int4', '--quant-block', '48');
    expect(odd.code).toBe(1);
    expect(odd.stderr).toContain('--quant-block: 48 is not one of 16, 32, 64, 128, 256');
    const unused = await generate('unused', '--quant-block', '64');
    expect(unused.code).toBe(1);
    expect(unused.stderr).toContain('--quant-block 64: only int8 / int4 weights have blocks');
  });
});
