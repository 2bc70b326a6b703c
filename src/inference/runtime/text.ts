import fs from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import type { Tokenizer } from '@huggingface/tokenizers';
import { TemplateRefused } from '../engine-api.js';
import type { ChatMessage } from '../engine-api.js';
import { TOKENIZE_INLINE_CHARS_MAX, tokenizeThread } from './tokenize-thread.js';
import { loadTokenizer, readTokenizerFiles } from './tokenizer.js';

// Text in and out of a model: its tokenizer.json, the chat template of its
// tokenizer_config.json, and incremental detokenisation for streams.

const tokenText = (t: unknown): string | undefined =>
  typeof t === 'string' ? t : t && typeof t === 'object' && typeof (t as { content?: unknown }).content === 'string' ? (t as { content: string }).content : undefined;

export class ModelText {
  readonly tokenizer: Tokenizer;
  readonly bosId: number | undefined;
  readonly eosIds: Set<number>;
  private readonly template: Template | undefined;
  private readonly bos: string;
  private readonly eos: string;
  private readonly addBos: boolean;

  /**
   * The most characters (UTF-16 units) one token can stand for: a text longer than
   * contextLength times this cannot fit, and is refused before it is tokenised.
   */
  readonly charsPerTokenMax: number;

  constructor(private readonly dir: string) {
    const files = readTokenizerFiles(dir);
    const tc = files.config;
    this.tokenizer = loadTokenizer(files);
    this.bos = tokenText(tc.bos_token) ?? '';
    this.eos = tokenText(tc.eos_token) ?? '';
    this.bosId = this.bos ? this.tokenizer.token_to_id(this.bos) : undefined;
    this.eosIds = new Set<number>();
    const eosId = this.eos ? this.tokenizer.token_to_id(this.eos) : undefined;
    if (eosId !== undefined) this.eosIds.add(eosId);
    // generation_config.json may list more end tokens (Llama 3, Qwen).
    const gen = path.join(dir, 'generation_config.json');
    if (fs.existsSync(gen)) {
      const g = JSON.parse(fs.readFileSync(gen, 'utf8'));
      for (const id of [g.eos_token_id].flat()) if (Number.isInteger(id)) this.eosIds.add(id);
    }
    this.addBos = tc.add_bos_token !== false && this.bosId !== undefined;
    const tpl = typeof tc.chat_template === 'string' ? tc.chat_template : Array.isArray(tc.chat_template) ? tc.chat_template.find((t: { name?: string }) => t.name === 'default')?.template : undefined;
    this.template = tpl ? new Template(tpl) : undefined;
    this.pieces = this.buildPieces();
    const strict = new TextDecoder('utf-8', { fatal: true });
    for (const p of this.pieces ?? []) {
      try {
        this.pieceText.push(strict.decode(p));
      } catch {
        this.pieceText.push(undefined);
      }
    }
    this.charsPerTokenMax = this.longestToken(files.tokenizer as never);
  }

  /**
   * From the decoded pieces where they are known, else from the vocabulary's
   * names (a byte-level or SentencePiece name is at least as long as its text);
   * added tokens (`<|im_start|>`) are matched whole in user text, so they count.
   */
  private longestToken(tj: { model?: { vocab?: unknown } }): number {
    let n = 1;
    if (this.pieces) for (const p of this.pieceText) n = Math.max(n, p?.length ?? 0);
    else {
      const v = tj.model?.vocab;
      const names = Array.isArray(v) ? v.map((e) => (Array.isArray(e) ? e[0] : e)) : v && typeof v === 'object' ? Object.keys(v) : [];
      for (const name of names) if (typeof name === 'string') n = Math.max(n, name.length);
    }
    for (const t of this.tokenizer.get_added_tokens_decoder().values()) n = Math.max(n, t.content.length);
    return n;
  }

  /**
   * Bytes each token adds mid-text, so streaming decodes a token with a table
   * lookup instead of two tokenizer calls. Built by decoding each token after
   * an anchor letter; byte-fallback tokens are their byte. Kept only if it
   * reproduces the tokenizer's own decode on sample texts (decoders that are
   * not per-token concatenations fall back to window decoding).
   */
  readonly pieces: Uint8Array[] | undefined;

  /** Each token's text mid-document, null where its bytes are not whole characters; undefined without pieces. */
  tokenTexts(): Array<string | null> | undefined {
    if (!this.pieces) return undefined;
    return this.pieces.map((_, id) => (this.eosIds.has(id) || id === this.bosId ? null : (this.pieceText[id] ?? null) || null));
  }
  /** The same pieces as strings, where a piece is whole UTF-8 on its own. */
  readonly pieceText: Array<string | undefined> = [];

  private buildPieces(): Uint8Array[] | undefined {
    const anchor = this.encode('x');
    if (this.decode(anchor) !== 'x') return undefined;
    const names: string[] = this.tokenizer.model?.vocab ?? [];
    let n = names.length;
    for (const id of this.tokenizer.get_added_tokens_decoder().keys()) n = Math.max(n, id + 1);
    if (n === 0 || n > 300_000) return undefined;
    const enc = new TextEncoder();
    const pieces: Uint8Array[] = [];
    for (let id = 0; id < n; id++) {
      const name = names[id];
      const byte = typeof name === 'string' ? /^<0x([0-9A-Fa-f]{2})>$/.exec(name) : null;
      if (byte) pieces.push(Uint8Array.of(parseInt(byte[1]!, 16)));
      else {
        const t = this.decode([...anchor, id]);
        pieces.push(t.startsWith('x') && !t.includes('\uFFFD') ? enc.encode(t.slice(1)) : new Uint8Array(0));
      }
    }
    const dec = new TextDecoder();
    for (const sample of ['Once upon a time, there was a girl.', ' héllo wörld 你好 🙂 "quoted"\n\tend', 'a  b   c']) {
      const ids = this.encode(sample);
      const ctx = anchor.concat(ids);
      const fast = dec.decode(Uint8Array.from(ids.flatMap((i) => [...(pieces[i] ?? [])])));
      if (this.decode(ctx).slice(1) !== fast) return undefined;
    }
    return pieces;
  }

  encode(text: string): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  /** The same ids; a long text is encoded on the tokenizer thread, never on the event loop. */
  encodeAsync(text: string): Promise<number[]> {
    return text.length <= TOKENIZE_INLINE_CHARS_MAX ? Promise.resolve(this.encode(text)) : tokenizeThread.encode(this.dir, text);
  }

  bosTokens(): number[] {
    return this.addBos ? [this.bosId!] : [];
  }

  /** Renders the chat template and encodes it; BOS is prepended only if the template did not write it. */
  async encodeChat(messages: ChatMessage[]): Promise<number[]> {
    const ids = await this.encodeAsync(this.renderChat(messages));
    if (this.addBos && ids[0] !== this.bosId) ids.unshift(this.bosId!);
    return ids;
  }

  private renderChat(messages: ChatMessage[]): string {
    let text: string;
    if (this.template) {
      try {
        text = this.template.render({ messages, add_generation_prompt: true, bos_token: this.bos, eos_token: this.eos });
      } catch (e) {
        throw new TemplateRefused((e as Error).message);
      }
    } else {
      text = `${messages.map((m) => `${m.role}: ${m.content}`).join('\n')}\nassistant:`;
    }
    return text;
  }

  decode(ids: number[]): string {
    return ids.length ? this.tokenizer.decode(ids, { skip_special_tokens: true }) : '';
  }
}

/** Whether `b` is well-formed UTF-8 (what a fatal TextDecoder accepts): no stray or missing continuation byte, no overlong form, surrogate or code point past U+10FFFF. */
export function isUtf8(b: Uint8Array): boolean {
  for (let i = 0; i < b.length; ) {
    const c = b[i]!;
    if (c < 0x80) {
      i++;
      continue;
    }
    // Continuation bytes after the lead, and the range of the first (which rules out overlongs, surrogates, > U+10FFFF).
    let n: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) n = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c === 0xe0) lo = 0xa0;
      else if (c === 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c === 0xf0) lo = 0x90;
      else if (c === 0xf4) hi = 0x8f;
    } else return false;
    if (i + n >= b.length) return false;
    if (b[i + 1]! < lo || b[i + 1]! > hi) return false;
    for (let k = 2; k <= n; k++) if (b[i + k]! < 0x80 || b[i + k]! > 0xbf) return false;
    i += n + 1;
  }
  return true;
}

/**
 * vLLM-style incremental detokenisation: decode a short window of recent
 * tokens and emit what it adds, holding back text that ends in a partial
 * UTF-8 sequence (U+FFFD) until the bytes that complete it arrive.
 */
export class Detokenizer {
  private readonly ids: number[];
  private prefixOffset = 0;
  private readOffset: number;
  private pending: number[] = [];
  private static readonly lenient = new TextDecoder('utf-8');

  constructor(
    private readonly text: ModelText,
    context: number[] = [],
  ) {
    this.ids = [...context];
    this.readOffset = context.length;
  }

  push(id: number): string {
    // Fast path: the token's bytes; the streaming decoder holds a split UTF-8 character.
    const pieces = this.text.pieces;
    if (!pieces) return this.pushSlow(id);
    const whole = this.text.pieceText[id];
    if (this.pending.length === 0 && whole !== undefined) return whole;
    this.pending.push(...(pieces[id] ?? []));
    const bytes = Uint8Array.from(this.pending);
    // An incomplete character waits for its next byte; more than 4 bytes cannot be one. (Checked,
    // not caught: a fatal decoder's throw cost the HTTP thread ~10 us a byte token.)
    if (!isUtf8(bytes) && this.pending.length < 4) return '';
    this.pending = [];
    return Detokenizer.lenient.decode(bytes);
  }

  private pushSlow(id: number): string {
    this.ids.push(id);
    const prefix = this.text.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const full = this.text.decode(this.ids.slice(this.prefixOffset));
    if (full.length > prefix.length && !full.endsWith('\uFFFD')) {
      const out = full.slice(prefix.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      return out;
    }
    return '';
  }
}

/**
 * Stop sequences on streamed text: text is released only once no stop string
 * can still begin inside it; a match ends the stream before the stop string.
 */
export class StopMatcher {
  private held = '';
  private readonly hold: number;

  constructor(private readonly stops: string[]) {
    this.hold = stops.reduce((m, s) => Math.max(m, s.length - 1), 0);
  }

  /** Returns the text safe to emit and whether a stop string was hit. */
  push(text: string): { out: string; stopped: boolean } {
    if (this.stops.length === 0) return { out: text, stopped: false };
    this.held += text;
    let cut = -1;
    for (const s of this.stops) {
      const i = this.held.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      const out = this.held.slice(0, cut);
      this.held = '';
      return { out, stopped: true };
    }
    // Keep the longest tail that is a prefix of some stop string.
    let keep = 0;
    for (let n = Math.min(this.hold, this.held.length); n > 0; n--) {
      const tail = this.held.slice(-n);
      if (this.stops.some((s) => s.startsWith(tail))) {
        keep = n;
        break;
      }
    }
    const out = this.held.slice(0, this.held.length - keep);
    this.held = this.held.slice(this.held.length - keep);
    return { out, stopped: false };
  }

  /** At the end of generation the held text is released. */
  flush(): string {
    const out = this.held;
    this.held = '';
    return out;
  }
}
