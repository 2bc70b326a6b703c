import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { prepareLlama2c } from '../src/inference/convert/convert.js';
import { findStories260k } from '../src/inference/convert/default-models.js';
import { FORMAT_DTYPE, writeModelDir } from '../src/inference/convert/model-config.js';
import { WEIGHT_FORMATS } from '../src/inference/convert/onnx-linear.js';
import { evaluationProbabilities, forcedAgreement, greedyTokens, largestChange, leadingAgreement, meanChange, GREEDY_TOKENS_COMPARED } from '../src/inference/convert/variant-quality.js';
import { Engine } from '../src/inference/runtime/engine.js';
import { prefillGraph } from '../src/inference/runtime/prefill-graph.js';
import { weightTypeHere } from '../src/inference/runtime/integer-products.js';

// Quality of each weight variant of stories260K against f32: how many of the
// first 40 greedy tokens equal f32's (three prompts), and the largest change of
// a "yes" probability over the evaluation bench's 64 questions. The rows "... on int8
// products" run every step, decode steps too, on the prefill session's graph
// (runtime/prefill-graph.ts), which the engine uses only for steps of several rows: the most
// that graph's rounding can change.
// The teacher-forced columns judge every one of f32's first 40 greedy tokens after 16 prompts on
// the same text (forcedAgreement): one early difference does not decide the rest, as it does
// in the leading counts.
// Usage: node dist/bench/quantization.js     (needs ../shared/models/stories260K)

const PROMPTS = ['The dog', 'Once upon a time', 'Lily and Tom went to the park'];
const FORCED_PROMPTS = [...PROMPTS, 'One day, a little girl', 'The sun was', 'Tim had a big', 'Mom said', 'There was a cat', 'The bird flew', 'Sam and his friend', 'In the forest', 'The little boy was sad', 'Anna wanted to', 'A big red ball', 'The old man', 'Every morning'];

interface Quality {
  tokens: number[][];
  probs: Record<string, number>;
  forcedAgree: number;
  /** per forced position, the probability given to f32's token */
  forcedProbs: number[];
}

async function main() {
  const stories = findStories260k();
  if (!stories) throw new Error('stories260K not found (../shared/models or SHARED_MODELS_DIR)');
  const ck = fs.readFileSync(path.join(stories, 'stories260K.bin'));
  const tok = fs.readFileSync(path.join(stories, 'tok512.bin'));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-quant-'));
  try {
    for (const kind of ['chat', 'evaluation'] as const) {
      const c = prepareLlama2c(ck, tok, { id: `q/${kind}`, kind, weights: [...WEIGHT_FORMATS] });
      writeModelDir(path.join(dir, kind), c);
      if (kind === 'chat') for (const v of c.onnx) console.log(`${v.dtype}: model file ${v.model.byteLength} bytes`);
    }
    // The same folders with each block-quantized graph replaced by its prefill graph.
    const int8Dir = path.join(dir, 'int8-products');
    for (const kind of ['chat', 'evaluation']) {
      fs.cpSync(path.join(dir, kind), path.join(int8Dir, kind), { recursive: true });
      for (const f of fs.readdirSync(path.join(int8Dir, kind)).filter((n) => n.endsWith('.onnx'))) {
        const g = prefillGraph(fs.readFileSync(path.join(int8Dir, kind, f)), await weightTypeHere(), path.join(int8Dir, kind));
        if (g) fs.writeFileSync(path.join(int8Dir, kind, f), g);
      }
    }
    const results = new Map<string, Quality>();
    let references: number[][] | undefined; // f32's greedy tokens after each forced prompt
    const runs = [...WEIGHT_FORMATS.map((f) => ({ name: f as string, f, modelsDir: dir })), ...(['int8', 'int4'] as const).map((f) => ({ name: `${f}, every step on int8 products`, f, modelsDir: int8Dir }))];
    for (const { name, f, modelsDir } of runs) {
      const e = await Engine.load({ modelsDir, executionProvider: 'cpu', strict: false, intraOpThreads: 1, dtype: FORMAT_DTYPE[f], prefillSession: false });
      try {
        const tokens = [];
        for (const p of PROMPTS) tokens.push(await greedyTokens(e, 'q/chat', p));
        if (name === 'f32') {
          references = [];
          for (const p of FORCED_PROMPTS) references.push(await greedyTokens(e, 'q/chat', p));
        }
        // Every variant is judged on f32's text, so f32 must have run before it.
        if (!references) throw new Error(`quantization: ${name} ran before f32, whose tokens it is judged on`);
        let forcedAgree = 0;
        const forcedProbs: number[] = [];
        for (const [i, p] of FORCED_PROMPTS.entries()) {
          const r = await forcedAgreement(e, 'q/chat', p, references[i]!);
          forcedAgree += r.agree;
          forcedProbs.push(...r.probs);
        }
        results.set(name, { tokens, probs: await evaluationProbabilities(e, 'q/evaluation'), forcedAgree, forcedProbs });
      } finally {
        await e.close();
      }
    }
    const base = results.get('f32')!;
    const positions = base.forcedProbs.length;
    console.log(`\n| weights | first ${GREEDY_TOKENS_COMPARED} greedy tokens equal to f32's (${PROMPTS.map((p) => JSON.stringify(p)).join(', ')}) | teacher-forced: f32's token most likely (${FORCED_PROMPTS.length} prompts, ${positions} positions) | mean change of f32's token's probability | largest change of a probability (64 questions) | mean change (64 questions) |`);
    console.log('| --- | --- | --- | --- | --- | --- |');
    for (const [f, r] of results) {
      const agree = r.tokens.map((t, i) => `${leadingAgreement(t, base.tokens[i]!)}/${base.tokens[i]!.length}`);
      const forced = `${r.forcedAgree}/${positions} (${(r.forcedAgree / positions).toFixed(3)})`;
      const tokenChange = meanChange(r.forcedProbs, base.forcedProbs);
      const probs = Object.keys(base.probs);
      const meanProbChange = meanChange(probs.map((k) => r.probs[k]!), probs.map((k) => base.probs[k]!));
      console.log(`| ${f} | ${agree.join(', ')} | ${forced} | ${tokenChange.toFixed(4)} | ${largestChange(r.probs, base.probs).toFixed(4)} | ${meanProbChange.toFixed(4)} |`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
