import fs from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { ApiError } from '../../errors.js';
import type { ChatMessage } from '../engine-api.js';

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

  constructor(dir: string) {
    const tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
    const tc = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
    this.tokenizer = new Tokenizer(tj, tc);
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
  }

  encode(text: string): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  bosTokens(): number[] {
    return this.addBos ? [this.bosId!] : [];
  }

  /** Renders the chat template and encodes it; BOS is prepended only if the template did not write it. */
  encodeChat(messages: ChatMessage[]): number[] {
    let text: string;
    if (this.template) {
      try {
        text = this.template.render({ messages, add_generation_prompt: true, bos_token: this.bos, eos_token: this.eos });
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
    return this.tokenizer.decode(ids, { skip_special_tokens: true });
  }
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

  constructor(
    private readonly text: ModelText,
    context: number[] = [],
  ) {
    this.ids = [...context];
    this.readOffset = context.length;
  }

  push(id: number): string {
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
