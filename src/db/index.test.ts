import net from 'node:net';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect } from './index.js';

// Closing a pool while its liveness probe's first statement is in flight must reject
// nothing unhandled (CI failed on that: postgres.js's array-type fetch on a new
// connection is a promise nobody awaits). A proxy in front of the PostgreSQL service
// stalls the answers to the probe connection's first statement, so the close always
// lands mid-statement. Skipped where no PostgreSQL answers.

const PG_URL = process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
/** PostgreSQL frontend message types that start a statement: Query and Parse. */
const STATEMENT_TYPES = new Set([0x51, 0x50]);

async function unreachable(): Promise<string | undefined> {
  const sql = postgres(PG_URL, { max: 1, connect_timeout: 2, onnotice: () => {} });
  try {
    await sql`SELECT 1`;
    return undefined;
  } catch (e) {
    return `no PostgreSQL answers at ${PG_URL} (${(e as Error).message})`;
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/** A TCP proxy to PostgreSQL; connections opened after `stallNew()` get no answer to their first statement. */
function stallingProxy(target: URL) {
  let stall = false;
  let stalled!: () => void;
  const firstStalled = new Promise<void>((r) => (stalled = r));
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    const stallThis = stall;
    let answering = true;
    let startup = true;
    client.on('data', (b) => {
      if (!startup && stallThis && answering && STATEMENT_TYPES.has(b[0]!)) {
        answering = false;
        stalled();
      }
      startup = false;
      upstream.write(b);
    });
    upstream.on('data', (b) => answering && client.write(b));
    const close = () => (client.destroy(), upstream.destroy());
    client.on('error', close).on('close', close);
    upstream.on('error', close).on('close', close);
  });
  return {
    server,
    stallNew: () => (stall = true),
    firstStalled,
    listen: () => new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port))),
  };
}

const skip = await unreachable();
if (skip) console.warn(`db/index.test skipped: ${skip}`);

describe.skipIf(skip !== undefined)('connect', () => {
  const rejections: unknown[] = [];
  const onRejection = (e: unknown) => rejections.push(e);
  beforeAll(() => void process.on('unhandledRejection', onRejection));
  afterAll(() => void process.off('unhandledRejection', onRejection));

  it('closes while the liveness probe is mid-statement without an unhandled rejection', async () => {
    const target = new URL(PG_URL);
    const proxy = stallingProxy(target);
    const port = await proxy.listen();
    const via = new URL(PG_URL);
    via.port = String(port);
    const sql = connect(via.toString(), 1);
    try {
      await sql`SELECT 1`; // the pool's own connection, answered in full
      proxy.stallNew(); // the probe connects on its first tick (250 ms) and is stalled
      await proxy.firstStalled;
    } finally {
      await sql.end({ timeout: 0 });
      proxy.server.close();
    }
    // A rejection nothing handles is reported after the microtask queue drains.
    await new Promise((r) => setTimeout(r, 100));
    expect(rejections).toEqual([]);
  });
});
