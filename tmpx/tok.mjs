import { readTokenizerFiles, loadTokenizer } from '../dist/src/inference/runtime/tokenizer.js';
const t = loadTokenizer(readTokenizerFiles('/tmp/k14/m25-int4/m25'));
const story = 'Once upon a time there was a little girl named Lily who loved to play in the park with her friends and her dog'.split(' ');
for (const n of [100, 200, 300]) { const p = Array.from({ length: n }, (_, i) => story[i % story.length]).join(' '); console.log(n, 'words', JSON.stringify(t.encode(p)).slice(0,80), (t.encode(p).ids ?? t.encode(p)).length, 'tokens'); }
