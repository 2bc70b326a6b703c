import ort from 'onnxruntime-node';
import { GraphBuilder } from '../src/inference/convert/onnx-graph.js';
import { linear, type WeightFormat } from '../src/inference/convert/onnx-linear.js';
import { prefillGraph } from '../src/inference/runtime/prefill-graph.js';
import { weightTypeHere } from '../src/inference/runtime/integer-products.js';
import { benchArgs, fmt, machine } from './lib.js';

// One weight matrix of the m25 / m110 shapes as each weight format writes it
// (onnx-linear.ts), timed alone in onnxruntime on one intra-op thread: picks
// MatMulNBits' accuracy_level and block size. Rows M: 1 and 16 decode streams,
// 256 prompt tokens.
// With --threads T (default 1) on T intra-op threads: `--threads 2` at M=256 is
// the machine's peak the engine's decode rate is compared with (bench/README.md).
// Usage: node dist/bench/matmul-nbits.js [--k 512] [--n 1376] [--ms 300] [--threads 1] [--rows 1,16,256]
// (--rows 1,704: an evaluation's 64 questions make a 704-row step on its branch graph)
// The rows "int8 products" are the int4 / int8 matrix as the prefill session runs it
// (runtime/prefill-graph.ts: onnxruntime's MatMulIntegerToFloat, activations rounded per row).

const args = benchArgs();
const K = Number(args.get('k') ?? 512);
const N = Number(args.get('n') ?? 1376);
const MS = Number(args.get('ms') ?? 300);
const THREADS = Number(args.get('threads') ?? 1);

async function session(format: WeightFormat, accuracyLevel?: number, block?: number, int8Products = false): Promise<ort.InferenceSession> {
  const gb = new GraphBuilder();
  const x = gb.input('x', 'float32', ['m', K]);
  const w = Float32Array.from({ length: K * N }, (_, i) => Math.sin(i * 0.7) * 0.02);
  linear(gb, x, 'w', w, K, N, { format, accuracyLevel, block }, 'y');
  gb.output('y', 'float32', ['m', N]);
  const { model } = gb.encode({ graphName: 'bench', opset: 17, producer: 'bench' });
  return ort.InferenceSession.create(int8Products ? prefillGraph(model, await weightTypeHere())! : model, { graphOptimizationLevel: 'all', intraOpNumThreads: THREADS, interOpNumThreads: 1 });
}

async function timeRuns(s: ort.InferenceSession, M: number): Promise<number> {
  const feeds = { x: new ort.Tensor('float32', Float32Array.from({ length: M * K }, (_, i) => Math.cos(i)), [M, K]) };
  for (let i = 0; i < 5; i++) await s.run(feeds);
  let n = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < MS) {
    await s.run(feeds);
    n++;
  }
  return ((performance.now() - t0) * 1000) / n;
}

async function main() {
  console.log(`machine: ${machine()}\nmatrix K=${K} N=${N}, ${THREADS} thread(s), microseconds per run (GFLOP/s)`);
  const rows = (args.get('rows') ?? '1,16,256').split(',').map(Number);
  console.log(`| weights | accuracy_level | block | ${rows.map((m) => `M=${m}`).join(' | ')} |`);
  console.log(`| --- | --- | --- | ${rows.map(() => '---').join(' | ')} |`);
  const cases: Array<[WeightFormat, number | undefined, number | undefined, boolean?]> = [
    ['f32', undefined, undefined],
    ['int8', 0, 32],
    ['int8', 4, 32],
    ['int8', 4, 64],
    ['int4', 0, 32],
    ['int4', 4, 32],
    ['int4', 4, 64],
    ['int4', 4, 128],
    ['int8', undefined, undefined, true],
    ['int4', undefined, undefined, true],
  ];
  for (const [f, level, block, int8Products] of cases) {
    const s = await session(f, level, block, int8Products);
    const cells = [];
    for (const m of rows) {
      const us = await timeRuns(s, m);
      cells.push(`${fmt(us, 1)} (${fmt((2 * m * K * N) / us / 1e3, 1)})`);
    }
    await s.release();
    console.log(`| ${f}${int8Products ? ', int8 products' : ''} | ${level ?? '-'} | ${block ?? '-'} | ${cells.join(' | ')} |`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
