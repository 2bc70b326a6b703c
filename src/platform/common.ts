import { invalid } from '../errors.js';
import type { Query } from '../http/context.js';
import { UNITS_PER_USD } from '../money/ledger.js';

// Small pieces every platform file uses: query integers, paging, money and time formats.

export const iso = (d: Date | null | undefined): string | null => (d ? d.toISOString() : null);

/** Stored units (USD x 10000) to a USD number for responses. */
export const usd = (units: number | null | undefined): number | null =>
  units === null || units === undefined ? null : units / UNITS_PER_USD;

/** A USD amount to stored units; prices are rounded to the stored resolution. */
export const units = (usdAmount: number): number => Math.round(usdAmount * UNITS_PER_USD);

/** Offsets beyond this are refused: deep offset paging is a scan, and no real list is that long. */
export const OFFSET_MAX = 1_000_000;

/**
 * An integer query parameter between min and max; absent gives the default.
 * Anything else (a fraction, text, out of range) is a 422 naming the parameter.
 */
export function queryInt(q: Query, name: string, def: number, min: number, max: number): number {
  const raw = q.get(name);
  if (raw === undefined || raw === '') return def;
  if (!/^-?\d+$/.test(raw.trim())) throw invalid(name, 'must be an integer', raw);
  const n = Number(raw);
  if (n < min) throw invalid(name, `must be at least ${min}`, raw);
  if (n > max) throw invalid(name, `must be at most ${max}`, raw);
  return n;
}

export interface Page {
  offset: number;
  limit: number;
}

/** `offset` (default 0, min 0) and `limit` (default and max per list, SPEC 8). */
export function offsetPage(q: Query, limitDefault: number, limitMax: number): Page {
  return { offset: queryInt(q, 'offset', 0, 0, OFFSET_MAX), limit: queryInt(q, 'limit', limitDefault, 1, limitMax) };
}

/** A string query parameter: absent or empty is undefined. */
export function queryStr(q: Query, name: string, maxChars = 200): string | undefined {
  const v = q.get(name);
  if (v === undefined || v === '') return undefined;
  if (v.length > maxChars) throw invalid(name, `must be at most ${maxChars} characters`, v);
  return v;
}

/** A repeatable list parameter (`a=x&a=y` or `a=x,y`), at most `max` values. */
export function queryList(q: Query, name: string, max: number): string[] {
  const v = [...new Set(q.all(name))];
  if (v.length > max) throw invalid(name, `must list at most ${max} values`, v.length);
  return v;
}

export function queryBool(q: Query, name: string): boolean | undefined {
  const v = q.get(name);
  if (v === undefined || v === '') return undefined;
  if (v === 'true' || v === '1') return true;
  if (v === 'false' || v === '0') return false;
  throw invalid(name, 'must be true or false', v);
}
