import { Ajv } from 'ajv';
import { describe, expect, it } from 'vitest';
import { mulberry32 } from '../runtime/sampler.js';
import { Matcher, TokenMasker, type Grammar } from './grammar.js';
import { jsonObjectGrammar, schemaGrammar, SchemaError } from './json-schema.js';

// Property tests: random schemas of the supported subset, random documents drawn by walking
// the grammar one code point at a time (any allowed character, stop when accepting), and
// every document must parse and validate with Ajv; documents the schema refuses must not match.

// Printable ASCII: what the documents are drawn from.
const ALPHABET = Array.from({ length: 0x7f - 0x20 }, (_, i) => 0x20 + i);

function walk(g: Grammar, rand: () => number, stepsMax = 3000): string | null {
  const m = new Matcher(g);
  let st = m.initial();
  let out = '';
  for (let i = 0; i < stepsMax; i++) {
    const next = ALPHABET.map((cp) => [cp, m.advance(st, cp)] as const).filter(([, s]) => s !== null);
    if (st.accepting && (next.length === 0 || rand() < 0.2)) return out;
    if (next.length === 0) throw new Error(`dead end after ${JSON.stringify(out)}`);
    // Prefer closing characters a little, so documents end.
    const closers = next.filter(([cp]) => cp === 0x7d || cp === 0x5d || cp === 0x22);
    const pool = closers.length && rand() < 0.35 ? closers : next;
    const [cp, s] = pool[Math.floor(rand() * pool.length)]!;
    out += String.fromCodePoint(cp);
    st = s!;
  }
  return null;
}

function randomSchema(rand: () => number, depth = 0): Record<string, unknown> {
  const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)]!;
  const kind = depth > 2 ? pick(['string', 'integer', 'boolean', 'null', 'enum', 'number']) : pick(['object', 'object', 'array', 'string', 'integer', 'anyOf', 'enum', 'number', 'boolean']);
  switch (kind) {
    case 'object': {
      const n = 1 + Math.floor(rand() * 3);
      const properties: Record<string, unknown> = {};
      for (let i = 0; i < n; i++) properties[`p${i}`] = randomSchema(rand, depth + 1);
      const required = Object.keys(properties).filter(() => rand() < 0.6);
      return { type: 'object', properties, required, additionalProperties: false };
    }
    case 'array': {
      const min = Math.floor(rand() * 2);
      return { type: 'array', items: randomSchema(rand, depth + 1), minItems: min, maxItems: min + Math.floor(rand() * 3) };
    }
    case 'string':
      return { type: 'string', minLength: Math.floor(rand() * 2), maxLength: 2 + Math.floor(rand() * 6) };
    case 'integer':
      return rand() < 0.5 ? { type: 'integer', minimum: -5, maximum: 20 } : { type: 'integer', minimum: 0 };
    case 'anyOf':
      return { anyOf: [randomSchema(rand, depth + 1), randomSchema(rand, depth + 1)] };
    case 'enum':
      return { enum: ['red', 'green', 3, null] };
    case 'number':
      return { type: 'number' };
    case 'boolean':
      return { type: 'boolean' };
    default:
      return { type: 'null' };
  }
}

describe('JSON schema grammar', () => {
  const ajv = new Ajv({ strict: false });

  it('draws only documents that parse and validate, over random schemas and seeds', () => {
    let docs = 0;
    for (let seed = 1; seed <= 60; seed++) {
      const rand = mulberry32(seed);
      const schema = randomSchema(rand);
      const validate = ajv.compile(schema);
      const g = schemaGrammar(schema);
      for (let k = 0; k < 5; k++) {
        const doc = walk(g, rand);
        if (doc === null) continue;
        const value = JSON.parse(doc);
        expect({ seed, schema, doc, valid: validate(value) }).toMatchObject({ valid: true });
        docs++;
      }
    }
    expect(docs).toBeGreaterThan(200);
  });

  it('accepts valid documents and refuses invalid ones character by character', () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 5 }, age: { type: 'integer', minimum: 0, maximum: 120 }, tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 2 } },
      required: ['name'],
      additionalProperties: false,
    };
    const m = new Matcher(schemaGrammar(schema));
    const ok = (s: string) => m.advanceText(m.initial(), s)?.accepting === true;
    expect(ok('{"name":"Ada"}')).toBe(true);
    expect(ok('{"name":"Ada","age":37,"tags":["a","b"]}')).toBe(true);
    expect(ok('{"name":"Ada","tags":[]}')).toBe(true);
    expect(ok('{"age":37}')).toBe(false); // name is required
    expect(ok('{"name":"Ada","age":121}')).toBe(false);
    expect(ok('{"name":"Adaline"}')).toBe(false); // maxLength 5
    expect(ok('{"name":"Ada","tags":["a","b","a"]}')).toBe(false);
    expect(ok('{"name":"Ada","extra":1}')).toBe(false);
  });

  it('follows $defs references, recursion included, and json_object mode takes any object', () => {
    const tree = { $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['v'] } }, $ref: '#/$defs/node' };
    const m = new Matcher(schemaGrammar(tree));
    expect(m.advanceText(m.initial(), '{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}')?.accepting).toBe(true);
    const o = new Matcher(jsonObjectGrammar());
    expect(o.advanceText(o.initial(), '{"a":[1,{"b":null}],"c":"x"}')?.accepting).toBe(true);
    expect(o.advanceText(o.initial(), '[1]')).toBeNull();
  });

  it('refuses keywords outside the subset by name and path', () => {
    const cases: Array<[unknown, string]> = [
      [{ type: 'string', pattern: '^a' }, '/pattern'],
      [{ type: 'object', properties: { d: { type: 'string', format: 'date' } } }, '/properties/d/format'],
      [{ oneOf: [{ type: 'string' }] }, '/oneOf'],
      [{ type: 'number', minimum: 1.5 }, '/minimum'],
      [{ type: 'integer', minimum: 0, maximum: 5000 }, '/maximum'],
      [{ $ref: 'http://example.com/x' }, '/$ref'],
    ];
    for (const [schema, path] of cases) {
      let err: unknown;
      try {
        schemaGrammar(schema);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(SchemaError);
      expect((err as SchemaError).path).toBe(path);
    }
  });

  it('masks a vocabulary: only tokens that keep the document valid, end of text when complete', () => {
    const m = new Matcher(schemaGrammar({ type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false }));
    const vocab = ['{"', 'ok', '":', 'true', 'false', '}', ' ', 'x', null, '{"ok":tr'];
    const masker = new TokenMasker(m, vocab);
    const allowed = new Uint8Array(vocab.length);
    let st = m.initial();
    masker.mask(st, allowed);
    expect([...allowed]).toEqual([1, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    st = m.advanceText(st, '{"ok":')!;
    masker.mask(st, allowed);
    expect([...allowed]).toEqual([0, 0, 0, 1, 1, 0, 0, 0, 0, 0]);
    st = m.advanceText(st, 'true}')!;
    expect(masker.mask(st, allowed)).toBe(0);
    expect(st.accepting).toBe(true);
  });
});
