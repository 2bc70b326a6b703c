import { z } from 'zod';
import type { Query } from './context.js';
import { parse } from './validate.js';

// Query parameters as zod schemas: one declaration parses them (with the field, the rule
// and the value in every refusal) and describes them in /openapi.json. A route declares
// `doc.query`; the server parses it before the handler, which reads it with `ctx.queryOf`.

/** Whether a parameter takes a list (`a=x&a=y` or `a=x,y`), read with `Query.all`: an array under its wrappers. */
function isList(s: z.ZodType): boolean {
  let def = s._zod.def as { type: string; innerType?: z.ZodType };
  while ((def.type === 'default' || def.type === 'optional') && def.innerType) def = def.innerType._zod.def as typeof def;
  return def.type === 'array';
}

/** An integer between min and max; absent or empty gives `def` (or undefined without one). */
export function qInt(def: number, min: number, max: number): z.ZodDefault<z.ZodCoercedNumber>;
export function qInt(def: undefined, min: number, max: number): z.ZodOptional<z.ZodCoercedNumber>;
export function qInt(def: number | undefined, min: number, max: number) {
  const n = z.coerce.number('must be an integer').int('must be an integer').min(min, `must be at least ${min}`).max(max, `must be at most ${max}`);
  return def === undefined ? n.optional() : n.default(def);
}

/** A string of at most `charsMax` characters; absent or empty is undefined. */
export const qStr = (charsMax = 200) => z.string().max(charsMax, `must be at most ${charsMax} characters`).optional();

/** A repeatable list of at most `max` distinct values; absent is an empty list. */
export const qList = (max: number) => z.array(z.string()).max(max, `must list at most ${max} values`).default([]);

/** Offsets beyond this are refused: deep offset paging is a scan, and no real list is that long. */
export const OFFSET_MAX = 1_000_000;

export interface Page {
  offset: number;
  limit: number;
}

/** `offset` (default 0) and `limit` (default and maximum per list, SPEC 8), as query fields. */
export const pageQuery = (limitDefault: number, limitMax: number) => ({ offset: qInt(0, 0, OFFSET_MAX), limit: qInt(limitDefault, 1, limitMax) });

/** `true`/`1` or `false`/`0`; absent is undefined. */
export const qBool = () =>
  z
    .enum(['true', '1', 'false', '0'], 'must be true or false')
    .transform((v) => v === 'true' || v === '1')
    .optional();

/**
 * The query parsed by its schema. Empty values count as absent (`?limit=` is the default);
 * a list parameter counts its distinct values, so `a=x,x` is one.
 */
export function parseQuery<S extends z.ZodObject>(schema: S, q: Query): z.infer<S> {
  const input: Record<string, string | string[]> = {};
  for (const [name, field] of Object.entries(schema.shape)) {
    if (isList(field as z.ZodType)) {
      const all = q.all(name);
      if (all.length) input[name] = [...new Set(all)];
      continue;
    }
    const v = q.get(name);
    if (v !== undefined && v !== '') input[name] = v;
  }
  return parse(schema, input);
}
