import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { log } from '../log.js';
import { withWait } from './bounded.js';
import type { Sql } from './index.js';

// SQL migrations in src/db/migrations, applied in file-name order, each once.
// All pending ones run in one transaction under an advisory lock, so several
// daemons starting against one database never apply a file twice or half.
// Number ranges: 0xx core, 1xx platform, 2xx money, 3xx inference.

const MIGRATION_LOCK = 7_242_001;
/**
 * Migrations are not bounded like requests' statements: one may rebuild an index of
 * a large table, and replicas starting together queue on the advisory lock.
 */
const MIGRATION_WAIT_MS = 10 * 60_000;

function migrationsDir(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  // Running from sources (vitest) or from dist/src/db (compiled): the .sql files stay in src/.
  for (const c of [path.join(here, 'migrations'), path.join(here, '../../../src/db/migrations')]) {
    if (fs.existsSync(c)) return c;
  }
  throw new Error(`migrations folder not found near ${here}`);
}

export async function migrate(sql: Sql): Promise<string[]> {
  const dir = migrationsDir();
  const files = fs.readdirSync(dir).filter((f) => /^\d+_.+\.sql$/.test(f)).sort();
  const applied: string[] = [];
  await withWait(sql, MIGRATION_WAIT_MS).begin(async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`;
    await tx`CREATE TABLE IF NOT EXISTS schema_migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`;
    const done = new Set((await tx<{ name: string }[]>`SELECT name FROM schema_migrations`).map((r) => r.name));
    for (const f of files) {
      if (done.has(f)) continue;
      await tx.unsafe(fs.readFileSync(path.join(dir, f), 'utf8'));
      await tx`INSERT INTO schema_migrations (name) VALUES (${f})`;
      applied.push(f);
    }
  });
  if (applied.length) log.info({ applied }, 'migrations applied');
  return applied;
}
