import { describe, expect, it } from 'vitest';
import { isUtf8 } from './text.js';

// isUtf8 stands in for a fatal TextDecoder (whose throw was the cost it saves): they must agree on every input.
const fatal = new TextDecoder('utf-8', { fatal: true });
const decodes = (b: Uint8Array) => {
  try {
    fatal.decode(b);
    return true;
  } catch {
    return false;
  }
};

describe('isUtf8', () => {
  it('agrees with a fatal TextDecoder on every 1- and 2-byte input', () => {
    for (let a = 0; a < 256; a++) {
      expect(isUtf8(Uint8Array.of(a)), `${a}`).toBe(decodes(Uint8Array.of(a)));
      for (let b = 0; b < 256; b++) {
        const x = Uint8Array.of(a, b);
        if (isUtf8(x) !== decodes(x)) expect.fail(`[${a}, ${b}]: isUtf8 ${isUtf8(x)}`);
      }
    }
  });

  it('agrees on 3- and 4-byte inputs around every lead byte, and on encoded text', () => {
    let seed = 7;
    const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 16) & 0xff;
    // Leads with continuation-range bytes after them, where the rules on the second byte bite.
    const near = [0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0];
    for (let lead = 0xc0; lead < 0x100; lead++) {
      for (const b1 of near) for (const b2 of near) for (const b3 of [...near, 0x41]) {
        for (const x of [Uint8Array.of(lead, b1, b2), Uint8Array.of(lead, b1, b2, b3)]) {
          if (isUtf8(x) !== decodes(x)) expect.fail(`[${[...x]}]: isUtf8 ${isUtf8(x)}`);
        }
      }
    }
    for (let i = 0; i < 50_000; i++) {
      const x = Uint8Array.from({ length: 1 + (i % 6) }, rand);
      if (isUtf8(x) !== decodes(x)) expect.fail(`[${[...x]}]: isUtf8 ${isUtf8(x)}`);
    }
    for (const s of ['héllo wörld', '你好', '🙂 ok', '\u{10ffff}', '\ud7ff\ue000']) expect(isUtf8(new TextEncoder().encode(s))).toBe(true);
  });
});
