// Turns a llama2.c vocabulary (pieces + scores, spaces stored as ' ') into a
// Hugging Face `tokenizer.json` / `tokenizer_config.json` pair in the Llama
// (SentencePiece BPE, legacy) layout, encoding exactly like llama2.c's encode():
//
// - normalizer: Prepend '▁' (llama2.c's dummy-prefix token) + Replace ' ' -> '▁'
// - model: BPE, byte_fallback (ids of '<0xNN>'), and a merges list holding
//   EVERY split (a, b) of every multi-character piece whose halves are both
//   pieces, ranked by the merged piece's score (highest first). llama2.c merges
//   the adjacent pair whose concatenation has the best score, so ranking all
//   splits by that score reproduces it; ties between different merged pieces do
//   not occur in SentencePiece vocabularies (scores are -rank).
// - decoder: '▁' -> ' ', ByteFallback, Fuse, strip one leading space.
// - special tokens <unk>=0, <s>=1, </s>=2 (llama2.c stores them as
//   "<unk>", "\n<s>\n", "\n</s>\n"; here they are named like Llama's).
//
// BOS: the post-processor adds <s> when a caller encodes with special tokens
// (add_bos_token: true). The chat template ALSO starts with {{ bos_token }};
// the engine renders the template and encodes WITHOUT special tokens, so the
// prompt gets exactly one BOS. Text after a special token gets its own '▁'
// prefix (like llama2.c's encode(text, bos=1) does).

export interface PieceVocab {
  pieces: string[];
  scores: ArrayLike<number>;
}

export const SPECIAL_TOKENS = { unk: '<unk>', bos: '<s>', eos: '</s>' } as const;
export const UNK_ID = 0;
export const BOS_ID = 1;
export const EOS_ID = 2;

/** A plain "role: content" template; BOS comes from the template, not from encode. */
export const DEFAULT_CHAT_TEMPLATE =
  "{{ bos_token }}{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}";

const BYTE_PIECE = /^<0x[0-9A-F]{2}>$/;

/** The HF token string for llama2.c piece `id`. */
export function hfTokenString(piece: string, id: number): string {
  if (id === UNK_ID) return SPECIAL_TOKENS.unk;
  if (id === BOS_ID) return SPECIAL_TOKENS.bos;
  if (id === EOS_ID) return SPECIAL_TOKENS.eos;
  if (BYTE_PIECE.test(piece)) return piece;
  return piece.replaceAll(' ', '\u2581');
}

export interface HfTokenizerFiles {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
  /** pieces that had to be renamed because their HF string collided */
  renamed: number[];
}

export function buildHfTokenizer(
  v: PieceVocab,
  opts: { modelMaxLength: number; chatTemplate?: string },
): HfTokenizerFiles {
  const n = v.pieces.length;
  if (n < 3) throw new Error('tokenizer: vocabulary needs at least <unk>, <s>, </s>');
  const vocab = new Map<string, number>();
  const strings: string[] = [];
  const renamed: number[] = [];
  for (let id = 0; id < n; id++) {
    let s = hfTokenString(v.pieces[id]!, id);
    if (s.length === 0 || vocab.has(s)) {
      s = `<unused_${id}>`;
      renamed.push(id);
    }
    vocab.set(s, id);
    strings.push(s);
  }
  // every split of every multi-character normal piece into two normal pieces
  const renamedSet = new Set(renamed);
  const isNormal = (id: number | undefined): boolean =>
    id !== undefined && id > EOS_ID && !BYTE_PIECE.test(strings[id]!) && !renamedSet.has(id);
  const merges: Array<{ a: string; b: string; score: number; id: number; k: number }> = [];
  for (let id = 0; id < n; id++) {
    if (!isNormal(id)) continue;
    const chars = Array.from(strings[id]!);
    if (chars.length < 2) continue;
    for (let k = 1; k < chars.length; k++) {
      const a = chars.slice(0, k).join('');
      const b = chars.slice(k).join('');
      if (isNormal(vocab.get(a)) && isNormal(vocab.get(b))) merges.push({ a, b, score: v.scores[id] ?? 0, id, k });
    }
  }
  merges.sort((x, y) => y.score - x.score || x.id - y.id || x.k - y.k);

  const added = [
    { id: UNK_ID, content: SPECIAL_TOKENS.unk },
    { id: BOS_ID, content: SPECIAL_TOKENS.bos },
    { id: EOS_ID, content: SPECIAL_TOKENS.eos },
  ].map((t) => ({ ...t, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));

  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: {
      type: 'Sequence',
      normalizers: [
        { type: 'Prepend', prepend: '\u2581' },
        { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' },
      ],
    },
    pre_tokenizer: null,
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: SPECIAL_TOKENS.bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [
        { SpecialToken: { id: SPECIAL_TOKENS.bos, type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: SPECIAL_TOKENS.bos, type_id: 1 } },
        { Sequence: { id: 'B', type_id: 1 } },
      ],
      special_tokens: { [SPECIAL_TOKENS.bos]: { id: SPECIAL_TOKENS.bos, ids: [BOS_ID], tokens: [SPECIAL_TOKENS.bos] } },
    },
    decoder: {
      type: 'Sequence',
      decoders: [
        { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
        { type: 'ByteFallback' },
        { type: 'Fuse' },
        { type: 'Strip', content: ' ', start: 1, stop: 0 },
      ],
    },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: SPECIAL_TOKENS.unk,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab: Object.fromEntries(vocab),
      merges: merges.map((m) => [m.a, m.b]),
    },
  };

  const addedDecoder = Object.fromEntries(
    added.map((t) => [String(t.id), { content: t.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }]),
  );
  const tokenizerConfig = {
    add_bos_token: true,
    add_eos_token: false,
    add_prefix_space: null,
    added_tokens_decoder: addedDecoder,
    bos_token: SPECIAL_TOKENS.bos,
    eos_token: SPECIAL_TOKENS.eos,
    unk_token: SPECIAL_TOKENS.unk,
    pad_token: SPECIAL_TOKENS.unk,
    padding_side: 'left',
    chat_template: opts.chatTemplate ?? DEFAULT_CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    legacy: true,
    model_max_length: opts.modelMaxLength,
    tokenizer_class: 'LlamaTokenizer',
  };
  return { tokenizerJson, tokenizerConfig, renamed };
}
