import { ApiError } from '../errors.js';
import { counter } from '../metrics.js';

// A stalled or dead PostgreSQL must not hold requests: the fault probe saw platform
// routes and /readyz hang 9-24 s under SIGSTOP, and connection errors surface as
// 500s. postgres.js has no per-query timeout, so every statement the daemon awaits
// is raced against DB_STATEMENT_WAIT_MS here, and connection failures become a 503
// with Retry-After in either API family.

/**
 * How long the daemon waits for one statement (and for a connection to run it on)
 * before asking whether the server is alive at all: if it has not answered its
 * liveness probe lately the caller gets a 503; if it has, the statement is slow on
 * a live server (a lock wait under load) and the wait goes on. Far above any
 * statement the daemon runs when healthy (~30 ms here), far below a client's patience.
 */
export const DB_STATEMENT_WAIT_MS = 2_000;
/** The liveness probe: `SELECT 1` on a connection of its own, this often (4 trivial statements a second)... */
const LIVENESS_PROBE_MS = 250;
/** ...and the server counts as alive while a probe answered within this: /readyz reads 503 within ~1 s of a stall. */
const LIVENESS_FRESH_MS = 750;

/** Whether the server answers at all, told by a probe on its own connection, so busy pools do not hide it. */
export class Liveness {
  private okAt = performance.now();
  private pending = false;
  private readonly timer: NodeJS.Timeout;

  constructor(probe: () => PromiseLike<unknown>) {
    this.timer = setInterval(() => {
      if (this.pending) return;
      this.pending = true;
      Promise.resolve(probe()).then(
        () => {
          this.okAt = performance.now();
          this.pending = false;
        },
        () => (this.pending = false),
      );
    }, LIVENESS_PROBE_MS);
    this.timer.unref();
  }

  alive(): boolean {
    return performance.now() - this.okAt < LIVENESS_FRESH_MS;
  }

  /** Milliseconds since the server last answered. */
  silentMs(): number {
    return performance.now() - this.okAt;
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
/** The Retry-After of a database outage: about the embedded server's restart. */
const DB_RETRY_AFTER_MS = 2_000;

const unavailableTotal = counter(
  { name: 'cloudgate_db_unavailable_total', help: 'Statements that found the database unreachable or stalled (timeout, refused, closed)', labelNames: ['reason'] },
  'platform',
);

/** SQLSTATE classes and client codes that mean "the server is not there", not "the statement is wrong". */
const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'CONNECT_TIMEOUT', 'CONNECTION_CLOSED', 'CONNECTION_DESTROYED', 'CONNECTION_ENDED', '57P01', '57P02', '57P03']);

export function isConnectionError(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === 'string' && (CONNECTION_CODES.has(code) || code.startsWith('08'));
}

/**
 * While the database is unreachable, an answer read from it this long ago still
 * serves: an admitted key keeps its inference (its charges are journaled and posted
 * when the database returns) and a wallet may overspend by at most this much usage.
 */
export const OUTAGE_STALE_MS_MAX = 60_000;

/**
 * After the database failed to answer, callers holding a cached answer use it without
 * asking again for this long (unless a statement succeeds meanwhile): otherwise each of
 * them would wait DB_STATEMENT_WAIT_MS for the same outage.
 */
const DB_DOWN_HOLD_MS = 5_000;
let lastFailureAt = -Infinity;

/** Whether the database failed recently and has not answered since. */
export const databaseDown = (): boolean => performance.now() - lastFailureAt < DB_DOWN_HOLD_MS;

function noteOutcome(ok: boolean): void {
  if (ok) lastFailureAt = -Infinity;
  else lastFailureAt = performance.now();
}

export const isDatabaseUnavailable = (e: unknown): boolean => e instanceof ApiError && e.code === 'database_unavailable';

export const databaseUnavailable = (why: string, cause?: unknown) =>
  new ApiError('unavailable', `the database is unavailable (${why}); retry shortly`, { code: 'database_unavailable', retryAfterMs: DB_RETRY_AFTER_MS, cause });

/** A failed statement's error as the caller gets it: a lost server is a 503, anything else unchanged. */
function asUnavailable(e: unknown): unknown {
  if (!isConnectionError(e)) return e;
  unavailableTotal.inc({ reason: 'connection' });
  noteOutcome(false);
  return databaseUnavailable((e as Error).message, e);
}

type Thenable = { then: (ok?: (v: unknown) => unknown, fail?: (e: unknown) => unknown) => Promise<unknown>; cancel?: () => unknown };

/**
 * Bounds a query when it is awaited (a query used as a fragment of another is never
 * awaited, so it is left alone): past the wait it is cancelled (a query still queued
 * for a connection is dropped; one already sent may still run when the server comes
 * back, as after any lost connection: writes that matter run in transactions, which
 * then roll back) and the caller gets a 503.
 */
function boundQuery<Q extends Thenable>(q: Q, waitMs: number, live: Liveness | undefined): Q {
  const then = q.then.bind(q);
  q.then = (ok, fail) =>
    new Promise((resolve, reject) => {
      const watch = new Watch(waitMs, live, (why) => {
        // Only a query still waiting for a connection is dropped: cancelling one already
        // sent would send a CancelRequest that can hit the next statement on that backend.
        if (!(q as { state?: unknown }).state) void Promise.resolve(q.cancel?.()).catch(() => undefined);
        reject(databaseUnavailable(why));
      });
      watch.arm('the statement');
      then(
        (v) => {
          watch.clear();
          noteOutcome(true);
          resolve(v);
        },
        (e) => {
          watch.clear();
          reject(asUnavailable(e));
        },
      );
    }).then(ok, fail);
  return q;
}

/**
 * Gives up on a step of the database's once `waitMs` passed with the server silent
 * (its liveness probe unanswered); on a live server a slow step is waited on.
 */
class Watch {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly waitMs: number,
    private readonly live: Liveness | undefined,
    private readonly giveUp: (why: string) => void,
  ) {}

  arm(step: string): void {
    this.clear();
    this.timer = setTimeout(() => {
      if (this.live?.alive()) return this.arm(step);
      unavailableTotal.inc({ reason: 'timeout' });
      noteOutcome(false);
      this.giveUp(`${step} had no answer within ${this.waitMs} ms`);
    }, this.waitMs);
  }

  clear(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/**
 * A bulk statement's wait: a 25 MiB sample batch is parsed and inserted by the
 * server in ~1-3 s here, more on a loaded machine; 30 s is still an answer, not a hang.
 */
export const DB_BULK_WAIT_MS = 30_000;

const UNBOUNDED = Symbol('unbounded');

const LIVENESS = Symbol('liveness');

/** The same pool with another wait, for the statements known to be long (bulk inserts). */
export function withWait<S extends object>(sql: S, waitMs: number): S {
  const s = sql as { [UNBOUNDED]?: S; [LIVENESS]?: Liveness };
  return bounded(s[UNBOUNDED] ?? sql, waitMs, s[LIVENESS]);
}

/** The liveness of a pool made by bounded(), if it has one. */
export const livenessOf = (sql: object): Liveness | undefined => (sql as { [LIVENESS]?: Liveness })[LIVENESS];

const isTemplate = (a: unknown): boolean => Array.isArray(a) && Array.isArray((a as unknown as { raw?: unknown }).raw);

/**
 * The pool (or a transaction's handle) with every awaited statement bounded. A
 * transaction is bounded step by step: BEGIN, each statement, COMMIT.
 */
export function bounded<S extends object>(sql: S, waitMs = DB_STATEMENT_WAIT_MS, live?: Liveness): S {
  return new Proxy(sql, {
    apply(target, self, args) {
      const r = Reflect.apply(target as (...a: unknown[]) => unknown, self, args);
      return isTemplate(args[0]) ? boundQuery(r as Thenable, waitMs, live) : r;
    },
    get(target, prop, receiver) {
      if (prop === UNBOUNDED) return target;
      if (prop === LIVENESS) return live;
      const v = Reflect.get(target, prop, receiver);
      if (prop === 'unsafe' && typeof v === 'function') return (...a: unknown[]) => boundQuery(v.apply(target, a) as Thenable, waitMs, live);
      if (prop === 'begin' && typeof v === 'function') return (...a: unknown[]) => boundBegin(target, v as (...x: unknown[]) => Promise<unknown>, a, waitMs, live);
      return v;
    },
  });
}

function boundBegin(target: object, begin: (...x: unknown[]) => Promise<unknown>, args: unknown[], waitMs: number, live: Liveness | undefined): Promise<unknown> {
  const fn = args[args.length - 1] as (tx: object) => unknown;
  return new Promise((resolve, reject) => {
    const watch = new Watch(waitMs, live, (why) => reject(databaseUnavailable(why)));
    watch.arm('BEGIN');
    const body = async (tx: object) => {
      watch.clear();
      try {
        return await fn(bounded(tx, waitMs, live));
      } catch (e) {
        // A statement that had no answer: tell the caller now, not after the ROLLBACK's own wait.
        if (isDatabaseUnavailable(e)) reject(e);
        throw e;
      } finally {
        watch.arm('COMMIT');
      }
    };
    begin.apply(target, [...args.slice(0, -1), body]).then(
      (v) => {
        watch.clear();
        resolve(v);
      },
      (e) => {
        watch.clear();
        reject(asUnavailable(e));
      },
    );
  });
}
