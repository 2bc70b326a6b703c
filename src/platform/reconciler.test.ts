import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { Sql } from '../db/index.js';
import type { Providers } from './providers/index.js';
import { Reconciler, reconcileSoon } from './reconciler.js';

// When the reconciler looks at the database: every look is a round trip on the HTTP
// thread, so an idle platform must not be polled ten times a second.

/** A database with no due rows, whose earliest pending poll time is `next`; counts the looks (the due-pods query). */
function fakeDb(next: () => Date | null): { sql: Sql; looks: () => number } {
  let looks = 0;
  const sql = ((strings: TemplateStringsArray) => {
    const text = strings.join('?');
    if (text.includes('FROM pods p')) looks++;
    return Promise.resolve(text.includes('LEAST') ? [{ next: next() }] : []);
  }) as unknown as Sql;
  return { sql, looks: () => looks };
}

const noProviders = {} as Providers;

describe('Reconciler', () => {
  let r: Reconciler | undefined;
  beforeEach(() => vi.useFakeTimers());
  afterEach(async () => {
    vi.useRealTimers();
    await r?.stop();
    r = undefined;
  });

  it('looks about once a second when nothing is pending, and at once when an order is placed', async () => {
    const db = fakeDb(() => null);
    r = new Reconciler(db.sql, noProviders);
    r.start();
    await vi.advanceTimersByTimeAsync(5_000);
    // the first look at 100 ms, then one a second
    expect(db.looks()).toBeGreaterThanOrEqual(5);
    expect(db.looks()).toBeLessThanOrEqual(6);
    const before = db.looks();
    reconcileSoon();
    await vi.advanceTimersByTimeAsync(1);
    expect(db.looks()).toBe(before + 1);
  });

  it('sleeps until the earliest pending poll, but never less than 100 ms', async () => {
    let ahead = 300; // the earliest pending poll, in ms after each look
    const db = fakeDb(() => new Date(Date.now() + ahead));
    r = new Reconciler(db.sql, noProviders);
    r.start();
    await vi.advanceTimersByTimeAsync(101); // the first look
    expect(db.looks()).toBe(1);
    await vi.advanceTimersByTimeAsync(250);
    expect(db.looks()).toBe(1);
    await vi.advanceTimersByTimeAsync(60); // 300 ms after the first look's answer
    expect(db.looks()).toBe(2);
    // a poll time already past: the next look after the minimum tick
    ahead = -1;
    await vi.advanceTimersByTimeAsync(300); // the look already scheduled, 300 ms after the second
    expect(db.looks()).toBe(3);
    await vi.advanceTimersByTimeAsync(100);
    expect(db.looks()).toBe(4);
  });

  it('looks again right after a look that an order arrived during', async () => {
    const db = fakeDb(() => null);
    r = new Reconciler(db.sql, noProviders);
    r.start();
    await vi.advanceTimersByTimeAsync(100); // the first look starts
    reconcileSoon(); // while it runs
    await vi.advanceTimersByTimeAsync(5);
    expect(db.looks()).toBe(2);
    // stopped: woken no more
    await r.stop();
    reconcileSoon();
    await vi.advanceTimersByTimeAsync(2_000);
    expect(db.looks()).toBe(2);
  });
});
