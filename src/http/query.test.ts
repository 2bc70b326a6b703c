import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { Query } from './context.js';
import { parseQuery, qBool, qInt, qList, qStr } from './query.js';

const Q = z.object({ page: qInt(1, 1, 10), n: qInt(undefined, 0, 5), ids: qList(3).describe('ids'), name: qStr(5), dry: qBool() });
const parsed = (raw: string) => parseQuery(Q, new Query(raw));
const refusal = (raw: string) => {
  try {
    parsed(raw);
  } catch (e) {
    return (e as Error).message;
  }
  throw new Error(`${raw} was accepted`);
};

describe('query parameters', () => {
  it('gives defaults for absent or empty values and reads lists in both forms, distinct', () => {
    expect(parsed('')).toEqual({ page: 1, ids: [] });
    expect(parsed('page=&n=')).toEqual({ page: 1, ids: [] });
    expect(parsed('page=3&n=0&ids=a&ids=b,a&name=x&dry=1')).toEqual({ page: 3, n: 0, ids: ['a', 'b'], name: 'x', dry: true });
  });

  it('refuses naming the parameter, the rule and the value', () => {
    expect(refusal('page=abc')).toBe('page: must be an integer (got "abc")');
    expect(refusal('page=1.5')).toBe('page: must be an integer (got "1.5")');
    expect(refusal('page=11')).toBe('page: must be at most 10 (got "11")');
    expect(refusal('n=-1')).toBe('n: must be at least 0 (got "-1")');
    expect(refusal('ids=a,b,c,d')).toBe('ids: must list at most 3 values (got ["a","b","c","d"])');
    expect(refusal('name=toolong')).toBe('name: must be at most 5 characters (got "toolong")');
    expect(refusal('dry=maybe')).toBe('dry: must be true or false (got "maybe")');
  });
});
