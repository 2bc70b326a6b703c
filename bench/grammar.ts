// Cost of the structured-output token mask (issue 15.4): one mask per constrained stream per
// decode step, over a real vocabulary, on the states of real documents.
// Usage: node dist/bench/grammar.js [--model models/stories260k] [--docs 200]
import path from 'node:path';
import { Matcher, TokenMasker } from '../src/inference/grammar/grammar.js';
import { schemaGrammar, jsonObjectGrammar } from '../src/inference/grammar/json-schema.js';
import { ModelText } from '../src/inference/runtime/text.js';
import { mulberry32 } from '../src/inference/runtime/sampler.js';

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : dflt;
};
const dir = path.resolve(arg('model', 'models/stories260k'));
const docs = Number(arg('docs', '200'));
const texts = new ModelText(dir).tokenTexts();
if (!texts) throw new Error(`${dir}: tokenizer pieces are not plain text`);
const person = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 }, happy: { type: 'boolean' }, pets: { type: 'array', items: { enum: ['cat', 'dog'] }, maxItems: 2 } },
  required: ['name', 'age', 'happy', 'pets'],
  additionalProperties: false,
};
for (const [name, g] of [['person schema', schemaGrammar(person)], ['json_object', jsonObjectGrammar()]] as const) {
  const m = new TokenMasker(new Matcher(g), texts);
  const allowed = new Uint8Array(texts.length);
  const rand = mulberry32(7);
  const us: number[] = [];
  for (let d = 0; d < docs; d++) {
    let st = m.matcher.initial();
    for (let step = 0; step < 64; step++) {
      const t0 = process.hrtime.bigint();
      const n = m.mask(st, allowed);
      us.push(Number(process.hrtime.bigint() - t0) / 1000);
      if (n === 0) break;
      const ids = [...allowed.keys()].filter((i) => allowed[i]);
      st = m.matcher.advanceText(st, texts[ids[Math.floor(rand() * ids.length)]!]!)!;
    }
  }
  us.sort((a, b) => a - b);
  const mean = us.reduce((a, b) => a + b, 0) / us.length;
  console.log(`${name}: vocabulary ${texts.length}, ${us.length} masks, mean ${mean.toFixed(1)} us, p50 ${us[us.length >> 1]!.toFixed(1)} us, p99 ${us[Math.floor(us.length * 0.99)]!.toFixed(1)} us; 16 streams: ${((16 * mean) / 1000).toFixed(2)} ms per decode step`);
}
