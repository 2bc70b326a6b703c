import fs from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { ApiError } from '../../errors.js';
import type { ChatMessage } from '../engine-api.js';

// Text in and out of a model: tokenizer.json, the chat template and special
// tokens of tokenizer_config.json, end tokens from generation_config.json.

/** A special token written as a string or as an AddedToken object `{content}`. */
const tokenText = (t: unknown): string | undefined =>
  typeof t === 'string' ? t : t && typeof t === 'object' && typeof (t as { content?: unknown }).content === 'string' ? (t as { content: string }).content : undefined;

const readJson = (file: string): Record<string, unknown> | undefined =>
  fs.existsSync(file) ? (JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, unknown>) : undefined;

export class ModelTokenizer {
  readonly tokenizer: Tokenizer;
  readonly bosId: number | undefined;
  /** Every id that ends generation (tokenizer_config eos_token, generation_config / config eos_token_id). */
  readonly eosIds: ReadonlySet<number>;
  readonly bosToken: string;
  readonly eosToken: string;
  private readonly template: Template | undefined;
  private readonly addBos: boolean;

  constructor(dir: string) {
    const tj = readJson(path.join(dir, 'tokenizer.json'));
    if (!tj) throw new Error('tokenizer.json missing');
    const tc = readJson(path.join(dir, 'tokenizer_config.json')) ?? {};
    // The tokenizer library types special tokens as strings; give it the plain text.
    const plain: Record<string, unknown> = { ...tc };
    for (const k of ['bos_token', 'eos_token', 'unk_token', 'pad_token', 'sep_token', 'cls_token', 'mask_token']) {
      if (k in plain) plain[k] = tokenText(plain[k]);
    }
    this.tokenizer = new Tokenizer(tj, plain);
    this.bosToken = tokenText(tc.bos_token) ?? '';
    this.eosToken = tokenText(tc.eos_token) ?? '';
    this.bosId = this.bosToken ? this.tokenizer.token_to_id(this.bosToken) : undefined;
    const eos = new Set<number>();
    const eosId = this.eosToken ? this.tokenizer.token_to_id(this.eosToken) : undefined;
    if (eosId !== undefined) eos.add(eosId);
    // generation_config.json may list more end tokens (Llama 3, Qwen); config.json when it is absent.
    const gen = readJson(path.join(dir, 'generation_config.json')) ?? readJson(path.join(dir, 'config.json'));
    for (const id of [gen?.eos_token_id].flat()) if (Number.isInteger(id)) eos.add(id as number);
    this.eosIds = eos;
    // add_bos_token when the config says; else whatever tokenizer.json's post-processor does.
    this.addBos =
      this.bosId !== undefined &&
      (typeof tc.add_bos_token === 'boolean' ? tc.add_bos_token : this.tokenizer.encode('a', { add_special_tokens: true }).ids[0] === this.bosId);
    const t = tc.chat_template;
    const tpl =
      typeof t === 'string'
        ? t
        : Array.isArray(t)
          ? (t as Array<{ name?: string; template?: string }>).find((x) => x.name === 'default')?.template
          : t && typeof t === 'object'
            ? (t as Record<string, string>).default
            : undefined;
    this.template = tpl ? new Template(tpl) : undefined;
  }

  get hasChatTemplate(): boolean {
    return this.template !== undefined;
  }

  /** Plain text to ids, no special tokens added. */
  encode(text: string): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  /** The BOS a sequence starts with, when the tokenizer adds one. */
  bosTokens(): number[] {
    return this.addBos ? [this.bosId!] : [];
  }

  /**
   * Renders the chat template (add_generation_prompt) and encodes the result
   * without adding special tokens again: templates write `{{ bos_token }}`
   * themselves. BOS is prepended only when the template did not write it and
   * the tokenizer adds one.
   */
  encodeChat(messages: ChatMessage[]): number[] {
    let text: string;
    if (this.template) {
      try {
        text = this.template.render({ messages, add_generation_prompt: true, bos_token: this.bosToken, eos_token: this.eosToken });
      } catch (e) {
        throw new ApiError('invalid', `messages: the model's chat template refused them: ${(e as Error).message}`, { param: 'messages' });
      }
    } else {
      text = `${messages.map((m) => `${m.role}: ${m.content}`).join('\n')}\nassistant:`;
    }
    const ids = this.encode(text);
    if (this.addBos && ids[0] !== this.bosId) ids.unshift(this.bosId!);
    return ids;
  }

  decode(ids: number[]): string {
    return ids.length ? this.tokenizer.decode(ids, { skip_special_tokens: true }) : '';
  }
}

/**
 * Incremental detokenisation (vLLM's offsets): decode a short window of recent
 * tokens and emit what the newest token adds. Text that ends in U+FFFD (a
 * UTF-8 character whose bytes are split over byte-fallback tokens) is held
 * until the token that completes it arrives, so no replacement-character
 * halves are ever emitted; a window always starts at a token boundary where
 * the previous text was complete.
 */
export class Detokenizer {
  private readonly ids: number[];
  private prefixOffset = 0;
  private readOffset: number;

  /** `context`: the last prompt tokens, so the first token's leading space decodes as in the full text. */
  constructor(
    private readonly tok: { decode(ids: number[]): string },
    context: number[] = [],
  ) {
    this.ids = context.slice(-4);
    this.readOffset = this.ids.length;
  }

  push(id: number): string {
    this.ids.push(id);
    const prefix = this.tok.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const full = this.tok.decode(this.ids.slice(this.prefixOffset));
    if (full.length > prefix.length && !full.endsWith('\uFFFD')) {
      const out = full.slice(prefix.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      // Keep the window short: only the last few tokens matter for the next decode.
      if (this.prefixOffset > 64) {
        this.ids.splice(0, this.prefixOffset);
        this.readOffset -= this.prefixOffset;
        this.prefixOffset = 0;
      }
      return out;
    }
    return '';
  }

  /** Text still held at the end (an incomplete character is emitted as decoded). */
  flush(): string {
    if (this.readOffset >= this.ids.length) return '';
    const prefix = this.tok.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const full = this.tok.decode(this.ids.slice(this.prefixOffset));
    this.prefixOffset = this.readOffset = this.ids.length;
    return full.length > prefix.length ? full.slice(prefix.length).replace(/\uFFFD+$/, '') : '';
  }
}
