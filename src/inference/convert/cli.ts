// Model conversion CLI.
//   node dist/src/inference/convert/cli.js <checkpoint.bin> <tokenizer.bin> <out-dir> [--id ID] [--kind chat|evaluation] [options]
//   node dist/src/inference/convert/cli.js generate <out-dir> [--dim 512 --layers 8 --heads 8 --kv-heads 8 --hidden 1376
//        --vocab 8192 --seq-len 1024 --seed 1] [--tokenizer tok.bin] [--id ID] [--kind chat|evaluation] [options]
// options: --context N --max-tokens-default N --max-tokens-cap N --price-in X --price-out X --owned-by S --created UNIX
//          --weights f32|f16|int8|int4[,...]  (weight variants to write; the first is served, see models/README.md)
//          --quant-block 16|32|64|128|256  (elements per block of int8 / int4; default 64 / 32)
import fs from 'node:fs';
import path from 'node:path';
import { generateModel, convertLlama2c, type ModelMeta } from './convert.js';
import type { GenerateParams } from './generate.js';
import type { ModelKind } from './model-config.js';
import { isQuantized, WEIGHT_FORMATS, type WeightFormat } from './onnx-linear.js';
import { isQuantBlock, QUANT_BLOCK_SIZES } from './quantize.js';

const USAGE = `usage:
  cli.js <checkpoint.bin> <tokenizer.bin> <out-dir> [--id ID] [--kind chat|evaluation]
  cli.js generate <out-dir> [--dim N] [--hidden N] [--layers N] [--heads N] [--kv-heads N]
         [--vocab N] [--seq-len N] [--seed N] [--std X] [--tokenizer tokenizer.bin] [--id ID] [--kind chat|evaluation]
common options: --context N --max-tokens-default N --max-tokens-cap N --price-in X --price-out X
                --owned-by NAME --created UNIX_SECONDS
                --weights f32|f16|int8|int4[,...]   weight variants (model.onnx, model_fp16.onnx, model_int8.onnx,
                                                    model_q4.onnx); the first listed is the one served
                --quant-block 16|32|64|128|256      elements per block of the int8 / int4 weights (default
                                                    64 for int8, 32 for int4: models/README.md)`;

type Flags = Map<string, string>;

function parse(argv: string[]): { positional: string[]; flags: Flags } {
  const positional: string[] = [];
  const flags: Flags = new Map();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '-h' || a === '--help') {
      console.log(USAGE);
      process.exit(0);
    }
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      if (eq > 0) flags.set(a.slice(2, eq), a.slice(eq + 1));
      else {
        const v = argv[i + 1];
        if (v === undefined) throw new Error(`${a} needs a value`);
        flags.set(a.slice(2), v);
        i++;
      }
    } else positional.push(a);
  }
  return { positional, flags };
}

function num(flags: Flags, name: string, def?: number, integer = true): number {
  const v = flags.get(name);
  flags.delete(name);
  if (v === undefined) {
    if (def === undefined) throw new Error(`--${name} is required`);
    return def;
  }
  const n = Number(v);
  if (!Number.isFinite(n) || (integer && !Number.isInteger(n))) throw new Error(`--${name}: not a valid number: ${v}`);
  return n;
}

function optNum(flags: Flags, name: string, integer = true): number | undefined {
  return flags.has(name) ? num(flags, name, undefined, integer) : undefined;
}

function str(flags: Flags, name: string): string | undefined {
  const v = flags.get(name);
  flags.delete(name);
  return v;
}

function meta(flags: Flags, outDir: string): ModelMeta {
  const kind = (str(flags, 'kind') ?? 'chat') as ModelKind;
  if (kind !== 'chat' && kind !== 'evaluation') throw new Error(`--kind must be chat or evaluation`);
  const priceIn = optNum(flags, 'price-in', false);
  const priceOut = optNum(flags, 'price-out', false);
  const m: ModelMeta = {
    id: str(flags, 'id') ?? `cloudgate/${path.basename(path.resolve(outDir))}`,
    kind,
    contextLength: optNum(flags, 'context'),
    maxTokensDefault: optNum(flags, 'max-tokens-default'),
    maxTokensCap: optNum(flags, 'max-tokens-cap'),
    ownedBy: str(flags, 'owned-by'),
    created: optNum(flags, 'created'),
  };
  const weights = str(flags, 'weights');
  if (weights !== undefined) {
    const list = weights.split(',').map((x) => x.trim());
    for (const w of list) if (!(WEIGHT_FORMATS as readonly string[]).includes(w)) throw new Error(`--weights: ${w} is not one of ${WEIGHT_FORMATS.join(', ')}`);
    m.weights = list as WeightFormat[];
  }
  const quantBlock = optNum(flags, 'quant-block');
  if (quantBlock !== undefined) {
    if (!isQuantBlock(quantBlock)) throw new Error(`--quant-block: ${quantBlock} is not one of ${QUANT_BLOCK_SIZES.join(', ')}`);
    if (!m.weights?.some(isQuantized)) throw new Error(`--quant-block ${quantBlock}: only int8 / int4 weights have blocks, and --weights names neither`);
    m.quantBlock = quantBlock;
  }
  if (priceIn !== undefined || priceOut !== undefined) {
    m.prices = { inputPerMTok: priceIn ?? 0, outputPerMTok: priceOut ?? 0 };
  }
  return m;
}

function done(flags: Flags): void {
  if (flags.size) throw new Error(`unknown option(s): ${[...flags.keys()].map((k) => '--' + k).join(', ')}`);
}

function main(argv: string[]): void {
  const { positional, flags } = parse(argv);
  const t0 = Date.now();
  if (positional[0] === 'generate') {
    const outDir = positional[1];
    if (!outDir || positional.length > 2) throw new Error(USAGE);
    const params: GenerateParams = {
      dim: num(flags, 'dim', 64),
      hiddenDim: num(flags, 'hidden', 172),
      nLayers: num(flags, 'layers', 5),
      nHeads: num(flags, 'heads', 8),
      nKvHeads: num(flags, 'kv-heads', 4),
      vocabSize: num(flags, 'vocab', 512),
      seqLen: num(flags, 'seq-len', 512),
      seed: num(flags, 'seed', 1),
    };
    const std = optNum(flags, 'std', false);
    if (std !== undefined) params.std = std;
    const tokPath = str(flags, 'tokenizer');
    const m = meta(flags, outDir);
    done(flags);
    const c = generateModel(params, outDir, m, tokPath ? fs.readFileSync(tokPath) : undefined);
    const nParams = countParams(params);
    console.log(`generated ${c.cloudgate.id} (${c.cloudgate.kind}, ${(nParams / 1e6).toFixed(2)}M parameters, ${variants(c)}) in ${outDir} in ${Date.now() - t0} ms`);
    return;
  }
  const [ckPath, tokPath, outDir] = positional;
  if (!ckPath || !tokPath || !outDir || positional.length > 3) throw new Error(USAGE);
  const m = meta(flags, outDir);
  done(flags);
  const c = convertLlama2c(fs.readFileSync(ckPath), fs.readFileSync(tokPath), outDir, m);
  console.log(`converted ${ckPath} -> ${outDir} as ${c.cloudgate.id} (${c.cloudgate.kind}, ${variants(c)}) in ${Date.now() - t0} ms`);
}

function variants(c: ReturnType<typeof convertLlama2c>): string {
  // The graph and, where the weights went beside it (external data), that file too.
  return c.onnx.map((v) => `${v.dtype} ${((v.model.byteLength + (v.data?.byteLength ?? 0)) / 1e6).toFixed(1)} MB`).join(', ');
}

function countParams(p: GenerateParams): number {
  const kd = (p.dim * p.nKvHeads) / p.nHeads;
  return p.vocabSize * p.dim + p.nLayers * (2 * p.dim * p.dim + 2 * kd * p.dim + 3 * p.dim * p.hiddenDim + 2 * p.dim) + p.dim;
}

try {
  main(process.argv.slice(2));
} catch (e) {
  console.error(e instanceof Error ? e.message : String(e));
  process.exit(1);
}
