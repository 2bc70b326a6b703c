import { z } from 'zod';
import { ApiError, showValue, type FieldIssue } from '../errors.js';

/** Ids are opaque strings; anything longer than this is not one of ours. */
export const ID_CHARS_MAX = 128;

/** An id in a body or query (pods, disks, teams, wallets, invoices, runs). */
export const idString = z.string('must be a string').min(1, 'must not be empty').max(ID_CHARS_MAX, `must be at most ${ID_CHARS_MAX} characters`);

/**
 * Parses a request part with a zod schema. Every failure names the field
 * (dotted path), the rule and the value given; the first one is the message
 * (inference bodies carry one), all of them are `issues` (platform bodies list all).
 */
export function parse<S extends z.ZodType>(schema: S, value: unknown, root = ''): z.infer<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issues: FieldIssue[] = r.error.issues.flatMap((i) => {
    // Unknown keys of a strict object: one issue per key, named by its own path.
    if (i.code === 'unrecognized_keys') {
      return i.keys.map((k) => {
        const param = [root, ...i.path.map(String), k].filter((s) => s !== '').join('.');
        return { param, details: `${param}: ${i.message} (got ${showValue(pick(value, [...(i.path as PropertyKey[]), k]))})` };
      });
    }
    const param = [root, ...i.path.map(String)].filter((s) => s !== '').join('.') || root || 'body';
    // A bad record key (a question id, an option name): the rule is the key schema's, the value the key.
    const nested = i.code === 'invalid_key' ? (i as { issues?: Array<{ message: string }> }).issues?.[0]?.message : undefined;
    const given = nested ? i.path[i.path.length - 1] : pick(value, i.path as PropertyKey[]);
    return { param, details: `${param}: ${nested ?? i.message} (got ${given === undefined ? 'nothing' : showValue(given)})` };
  });
  const first = issues[0]!;
  throw new ApiError('invalid', first.details, { param: first.param, issues });
}

function pick(v: unknown, path: PropertyKey[]): unknown {
  let cur = v;
  for (const k of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[k];
  }
  return cur;
}
