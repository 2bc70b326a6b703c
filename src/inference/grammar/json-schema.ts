import type { CharElem, Elem, Grammar, RefElem, Rule } from './grammar.js';

// JSON schema -> grammar, for structured outputs (response_format json_schema, tool arguments).
// The subset OpenAI's strict mode and the usual clients use; any other keyword is refused by
// name, never ignored. Output is compact JSON (no whitespace between tokens): a small model
// cannot then wander into endless whitespace, and every document is still valid JSON.
// Properties come in the schema's order, as llama.cpp's and OpenAI's strict mode emit them.

/** A schema the compiler cannot honour: `path` is the JSON pointer inside the schema. */
export class SchemaError extends Error {
  constructor(
    readonly path: string,
    message: string,
  ) {
    super(message);
  }
}

/** Bounded repetitions (string lengths, array items) unroll into this many rules at most. */
export const REPEAT_BOUND_MAX = 1000;
/** Integer ranges are spelled out as alternatives up to this many values. */
export const INT_RANGE_VALUES_MAX = 1000;
/** Digits an unconstrained number may have: a model cannot run on digits forever. */
const INT_DIGITS_MAX = 16;
const FRACTION_DIGITS_MAX = 15;

// Keywords that describe and do not constrain.
const ANNOTATIONS = new Set(['title', 'description', 'default', 'examples', '$schema', '$id', '$comment', 'strict', 'deprecated', 'readOnly', 'writeOnly']);
const SUPPORTED = new Set([
  'type', 'properties', 'required', 'additionalProperties', 'items', 'minItems', 'maxItems', 'enum', 'const', 'anyOf',
  '$ref', '$defs', 'definitions', 'minLength', 'maxLength', 'minimum', 'maximum',
]);

const ch = (...cps: number[]): CharElem => ({ k: 'c', r: cps.flatMap((c) => [c, c]) });
const range = (lo: string, hi: string): CharElem => ({ k: 'c', r: [lo.codePointAt(0)!, hi.codePointAt(0)!] });

class Builder {
  readonly rules: Rule[] = [];
  private readonly defs = new Map<string, number>();
  private readonly memo = new Map<string, RefElem>();

  constructor(private readonly rootSchema: unknown) {}

  rule(alts: Elem[][]): RefElem {
    this.rules.push(alts);
    return { k: 'r', id: this.rules.length - 1 };
  }

  /** A shared helper rule, built once. */
  shared(name: string, make: () => Elem[][]): RefElem {
    let r = this.memo.get(name);
    if (!r) {
      r = { k: 'r', id: this.rules.length };
      this.rules.push([]);
      this.memo.set(name, r);
      this.rules[r.id] = make();
    }
    return r;
  }

  lit(s: string): Elem[] {
    return [...s].map((c) => ch(c.codePointAt(0)!));
  }

  /** `x` repeated min..max times (max Infinity: unbounded). */
  repeat(x: Elem[], min: number, max: number): Elem[] {
    const out: Elem[] = [];
    for (let i = 0; i < min; i++) out.push(...x);
    if (max === Infinity) {
      const star: RefElem = { k: 'r', id: this.rules.length };
      this.rules.push([[...x, star], []]);
      out.push(star);
    } else {
      let tail: RefElem | undefined;
      for (let i = 0; i < max - min; i++) tail = this.rule([[...x, ...(tail ? [tail] : [])], []]);
      if (tail) out.push(tail);
    }
    return out;
  }

  // ------------------------------------------------------------------ JSON primitives

  stringChar(): RefElem {
    return this.shared('char', () => {
      const hex: CharElem = { k: 'c', r: [0x30, 0x39, 0x41, 0x46, 0x61, 0x66] };
      return [[{ k: 'c', r: [0x22, 0x22, 0x5c, 0x5c, 0, 0x1f], not: true }], [ch(0x5c), ch(...[...'"\\/bfnrt'].map((c) => c.codePointAt(0)!))], [ch(0x5c), ch(0x75), hex, hex, hex, hex]];
    });
  }

  string(min = 0, max = Infinity): Elem[] {
    return [ch(0x22), ...this.repeat([this.stringChar()], min, max), ch(0x22)];
  }

  integer(nonNegative = false, positive = false): Elem[] {
    const digits = this.repeat([range('0', '9')], 0, INT_DIGITS_MAX - 1);
    const body = this.rule(positive ? [[range('1', '9'), ...digits]] : [[ch(0x30)], [range('1', '9'), ...digits]]);
    return nonNegative || positive ? [body] : [this.rule([[ch(0x2d)], []]), body];
  }

  number(): Elem[] {
    const frac = this.rule([[ch(0x2e), ...this.repeat([range('0', '9')], 1, FRACTION_DIGITS_MAX)], []]);
    const exp = this.rule([[ch(0x65, 0x45), this.rule([[ch(0x2b, 0x2d)], []]), ...this.repeat([range('0', '9')], 1, 3)], []]);
    return [...this.integer(), frac, exp];
  }

  /** Any JSON value (json_object mode, or a schema without constraints). */
  anyValue(): RefElem {
    return this.shared('value', () => {
      const value: RefElem = this.memo.get('value')!;
      const member = [this.rule([this.string()]), ch(0x3a), value];
      const object = this.rule([[ch(0x7b), ch(0x7d)], [ch(0x7b), ...member, ...this.repeat([ch(0x2c), ...member], 0, Infinity), ch(0x7d)]]);
      const array = this.rule([[ch(0x5b), ch(0x5d)], [ch(0x5b), value, ...this.repeat([ch(0x2c), value], 0, Infinity), ch(0x5d)]]);
      return [[object], [array], this.string(), this.number(), this.lit('true'), this.lit('false'), this.lit('null')];
    });
  }

  anyObject(): RefElem {
    return this.shared('object', () => {
      const member = [this.rule([this.string()]), ch(0x3a), this.anyValue()];
      return [[ch(0x7b), ch(0x7d)], [ch(0x7b), ...member, ...this.repeat([ch(0x2c), ...member], 0, Infinity), ch(0x7d)]];
    });
  }

  // ------------------------------------------------------------------ schemas

  schema(s: unknown, path: string): RefElem {
    if (s === true || (isObj(s) && Object.keys(s).every((k) => ANNOTATIONS.has(k)))) return this.anyValue();
    if (!isObj(s)) throw new SchemaError(path, 'must be a JSON schema object');
    for (const k of Object.keys(s)) {
      if (!SUPPORTED.has(k) && !ANNOTATIONS.has(k)) throw new SchemaError(`${path}/${k}`, `the keyword ${JSON.stringify(k)} is not supported for structured output; supported: ${[...SUPPORTED].join(', ')}`);
    }
    if (s.$ref !== undefined) return this.ref(s.$ref, `${path}/$ref`);
    if (s.const !== undefined) return this.rule([this.lit(JSON.stringify(s.const))]);
    if (s.enum !== undefined) {
      if (!Array.isArray(s.enum) || s.enum.length === 0) throw new SchemaError(`${path}/enum`, 'must be a non-empty array');
      return this.rule(s.enum.map((v) => this.lit(JSON.stringify(v))));
    }
    if (s.anyOf !== undefined) {
      if (!Array.isArray(s.anyOf) || s.anyOf.length === 0) throw new SchemaError(`${path}/anyOf`, 'must be a non-empty array');
      return this.rule(s.anyOf.map((x, i) => [this.schema(x, `${path}/anyOf/${i}`)]));
    }
    const types = s.type === undefined ? undefined : Array.isArray(s.type) ? s.type : [s.type];
    if (!types) {
      if (s.properties !== undefined) return this.object(s, path);
      if (s.items !== undefined) return this.array(s, path);
      return this.anyValue();
    }
    return this.rule(types.map((t) => [this.typed(String(t), s, path)]));
  }

  private typed(t: string, s: Record<string, unknown>, path: string): RefElem {
    switch (t) {
      case 'object':
        return this.object(s, path);
      case 'array':
        return this.array(s, path);
      case 'string': {
        const min = count(s.minLength, `${path}/minLength`, 0);
        const max = s.maxLength === undefined ? Infinity : count(s.maxLength, `${path}/maxLength`, 0);
        if (max !== Infinity && max - min > REPEAT_BOUND_MAX) throw new SchemaError(`${path}/maxLength`, `maxLength - minLength may be at most ${REPEAT_BOUND_MAX}`);
        if (max < min) throw new SchemaError(`${path}/maxLength`, 'must be at least minLength');
        return this.rule([this.string(min, max)]);
      }
      case 'integer':
        return this.intRange(s, path);
      case 'number':
        if (s.minimum !== undefined || s.maximum !== undefined) throw new SchemaError(`${path}/${s.minimum !== undefined ? 'minimum' : 'maximum'}`, 'ranges are supported on integers only');
        return this.rule([this.number()]);
      case 'boolean':
        return this.rule([this.lit('true'), this.lit('false')]);
      case 'null':
        return this.rule([this.lit('null')]);
      default:
        throw new SchemaError(`${path}/type`, `unknown type ${JSON.stringify(t)}`);
    }
  }

  private intRange(s: Record<string, unknown>, path: string): RefElem {
    const lo = s.minimum;
    const hi = s.maximum;
    if (lo === undefined && hi === undefined) return this.rule([this.integer()]);
    if (lo !== undefined && (typeof lo !== 'number' || !Number.isInteger(lo))) throw new SchemaError(`${path}/minimum`, 'must be an integer on an integer');
    if (hi !== undefined && (typeof hi !== 'number' || !Number.isInteger(hi))) throw new SchemaError(`${path}/maximum`, 'must be an integer on an integer');
    if (typeof lo === 'number' && typeof hi === 'number') {
      if (hi < lo) throw new SchemaError(`${path}/maximum`, 'must be at least minimum');
      if (hi - lo + 1 > INT_RANGE_VALUES_MAX) throw new SchemaError(`${path}/maximum`, `integer ranges may span at most ${INT_RANGE_VALUES_MAX} values`);
      return this.rule(Array.from({ length: hi - lo + 1 }, (_, i) => this.lit(String(lo + i))));
    }
    if (hi === undefined && (lo === 0 || lo === 1)) return this.rule([this.integer(lo === 0, lo === 1)]);
    throw new SchemaError(`${path}/${hi === undefined ? 'minimum' : 'maximum'}`, `a one-sided integer bound is supported only as minimum 0 or 1; give both bounds (at most ${INT_RANGE_VALUES_MAX} values)`);
  }

  private object(s: Record<string, unknown>, path: string): RefElem {
    if (s.additionalProperties !== undefined && typeof s.additionalProperties !== 'boolean') {
      throw new SchemaError(`${path}/additionalProperties`, 'only true or false is supported (the listed properties are generated either way)');
    }
    const props = s.properties ?? {};
    if (!isObj(props)) throw new SchemaError(`${path}/properties`, 'must be an object');
    const required = s.required ?? [];
    if (!Array.isArray(required)) throw new SchemaError(`${path}/required`, 'must be an array');
    for (const r of required) if (!(String(r) in props)) throw new SchemaError(`${path}/required`, `lists ${JSON.stringify(r)}, which is not in properties`);
    const names = Object.keys(props);
    if (names.length === 0) return s.additionalProperties === false ? this.rule([this.lit('{}')]) : this.anyObject();
    const members = names.map((n) => [...this.lit(`${JSON.stringify(n)}:`), this.schema(props[n], `${path}/properties/${escapePtr(n)}`)]);
    const isReq = names.map((n) => required.includes(n));
    // rest(i, first): the members from i on; `first` when no member was written yet (no comma before).
    const memo = new Map<string, RefElem>();
    const rest = (i: number, first: boolean): RefElem => {
      const key = `${i}.${first}`;
      let r = memo.get(key);
      if (r) return r;
      r = { k: 'r', id: this.rules.length };
      this.rules.push([]);
      memo.set(key, r);
      const alts: Elem[][] = [];
      if (i === names.length) alts.push([]);
      else {
        alts.push([...(first ? [] : [ch(0x2c)]), ...members[i]!, rest(i + 1, false)]);
        if (!isReq[i]) alts.push([rest(i + 1, first)]);
      }
      this.rules[r.id] = alts;
      return r;
    };
    return this.rule([[ch(0x7b), rest(0, true), ch(0x7d)]]);
  }

  private array(s: Record<string, unknown>, path: string): RefElem {
    const item = s.items === undefined ? this.anyValue() : this.schema(s.items, `${path}/items`);
    const min = count(s.minItems, `${path}/minItems`, 0);
    const max = s.maxItems === undefined ? Infinity : count(s.maxItems, `${path}/maxItems`, 0);
    if (max < min) throw new SchemaError(`${path}/maxItems`, 'must be at least minItems');
    if (max !== Infinity && max - min > REPEAT_BOUND_MAX) throw new SchemaError(`${path}/maxItems`, `maxItems - minItems may be at most ${REPEAT_BOUND_MAX}`);
    const alts: Elem[][] = [];
    if (min === 0) alts.push(this.lit('[]'));
    if (max >= 1) alts.push([ch(0x5b), item, ...this.repeat([ch(0x2c), item], Math.max(0, min - 1), max - 1), ch(0x5d)]);
    return this.rule(alts);
  }

  private ref(ref: unknown, path: string): RefElem {
    const m = typeof ref === 'string' ? /^#\/(\$defs|definitions)\/(.+)$/.exec(ref) : null;
    if (!m) throw new SchemaError(path, 'only local references to #/$defs/... or #/definitions/... are supported');
    const existing = this.defs.get(ref as string);
    if (existing !== undefined) return { k: 'r', id: existing };
    const name = m[2]!.replace(/~1/g, '/').replace(/~0/g, '~');
    const table = isObj(this.rootSchema) ? this.rootSchema[m[1]!] : undefined;
    const target = isObj(table) ? table[name] : undefined;
    if (target === undefined) throw new SchemaError(path, `${JSON.stringify(ref)} does not resolve`);
    // Reserved before compiling, so recursive definitions refer to themselves.
    const id = this.rules.length;
    this.rules.push([]);
    this.defs.set(ref as string, id);
    this.rules[id] = [[this.schema(target, `/${m[1]}/${m[2]}`)]];
    return { k: 'r', id };
  }
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
function count(v: unknown, path: string, dflt: number): number {
  if (v === undefined) return dflt;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new SchemaError(path, 'must be a non-negative integer');
  return v;
}
const escapePtr = (s: string) => s.replace(/~/g, '~0').replace(/\//g, '~1');

/** The grammar of documents valid against `schema` (JSON schema subset; SchemaError otherwise). */
export function schemaGrammar(schema: unknown): Grammar {
  const b = new Builder(schema);
  const root = b.schema(schema, '');
  return { rules: b.rules, root: root.id };
}

/** `response_format: {type: "json_object"}`: any JSON object. */
export function jsonObjectGrammar(): Grammar {
  const b = new Builder({});
  const root = b.anyObject();
  return { rules: b.rules, root: root.id };
}
