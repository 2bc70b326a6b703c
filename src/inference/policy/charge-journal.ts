import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { Sql, Tx } from '../../db/index.js';
import { log } from '../../log.js';

// A write-ahead journal of inference usage, so that no charge is lost between two
// ledger flushes: each settled request is appended (one write(2), before its answer
// is complete) to a file in DATA_DIR, and the ledger flush records in the same
// transaction how far the journal is posted (inference_charge_journals). A kill -9
// loses nothing the kernel has (the page cache survives the process); a power loss
// loses at most JOURNAL_FSYNC_INTERVAL_MS of usage. The next start posts what a dead
// daemon's journal holds past its checkpoint, exactly once.

/** fdatasync period: what a machine crash (not a process kill) can lose. */
export const JOURNAL_FSYNC_INTERVAL_MS = 200;
/** A journal this large is replaced by a fresh one at the next flush (~150 bytes an entry, ~110,000 requests). */
export const JOURNAL_ROTATE_BYTES = 16 * 1024 * 1024;

/** One settled request: who pays, for what, its exact cost numerator (units x 1e8) and tokens. */
export interface JournalEntry {
  s: number;
  w: string;
  m: string;
  n: number;
  r: string | null;
  i: number;
  o: number;
}

export type Remainders = Record<string, number>;
// The unit separator: jsonb (the checkpoint's remainders) cannot hold \u0000, and no id contains it.
const KEY_SEP = '\u001f';
export const tallyKey = (walletId: string, model: string) => `${walletId}${KEY_SEP}${model}`;
export const splitTallyKey = (k: string) => k.split(KEY_SEP) as [string, string];

/** What a flush covers: entries up to `seq` of journal `id`, and full journals it retires. */
export interface FlushMark {
  id: string;
  seq: number;
  retiring: Array<{ id: string; fd: number }>;
}

export class ChargeJournal {
  private fd: number;
  private dirty = false;
  private size = 0;
  private timer: NodeJS.Timeout;
  /** Journals replaced by a fresh one, kept until a committed checkpoint marks them done. */
  private retiring: Array<{ id: string; fd: number }> = [];
  /** The last entry's sequence number (entries are numbered from 1 in each journal). */
  seq = 0;

  private constructor(
    private readonly dir: string,
    public id: string,
  ) {
    this.fd = ChargeJournal.create(dir, id);
    this.timer = setInterval(() => this.trySync(), JOURNAL_FSYNC_INTERVAL_MS);
    this.timer.unref();
  }

  private static file(dir: string, id: string): string {
    return path.join(dir, `charges-${id}.journal`);
  }

  private static create(dir: string, id: string): number {
    const fd = fs.openSync(ChargeJournal.file(dir, id), 'a');
    fs.writeSync(fd, `${JSON.stringify({ journal: id, v: 1 })}\n`);
    fs.fdatasyncSync(fd);
    return fd;
  }

  /**
   * Opens this daemon's journal in `dir` after posting every journal a previous
   * daemon left there. One daemon per directory: a live owner makes this throw.
   */
  static async open(sql: Sql, dir: string, post: PostEntries): Promise<ChargeJournal> {
    fs.mkdirSync(dir, { recursive: true });
    lockDir(dir);
    for (const f of fs.readdirSync(dir).filter((x) => /^charges-.+\.journal$/.test(x)).sort()) {
      await recover(sql, path.join(dir, f), post);
    }
    return new ChargeJournal(dir, randomUUID());
  }

  append(e: Omit<JournalEntry, 's'>): number {
    const line = `${JSON.stringify({ s: ++this.seq, ...e })}\n`;
    fs.writeSync(this.fd, line);
    this.size += line.length;
    this.dirty = true;
    return this.seq;
  }

  /** Forces the journal to disk; throws when it cannot (the caller must not claim the charges are kept). */
  sync(): void {
    if (!this.dirty) return;
    fs.fdatasyncSync(this.fd);
    this.dirty = false;
  }

  private syncing = false;
  /** The periodic sync runs on libuv's thread pool: a synchronous fdatasync stalled the event loop ~8 ms. */
  private trySync(): void {
    if (!this.dirty || this.syncing) return;
    this.dirty = false;
    this.syncing = true;
    fs.fdatasync(this.fd, (e) => {
      this.syncing = false;
      if (e) {
        this.dirty = true;
        log.error({ err: e }, 'charge journal fsync failed');
      }
    });
  }

  /**
   * Marks what a flush is about to post. A large journal is replaced here, synchronously,
   * by a fresh one: every entry of the old one is then covered by this mark.
   */
  mark(): FlushMark {
    if (this.size >= JOURNAL_ROTATE_BYTES) {
      this.sync();
      this.retiring.push({ id: this.id, fd: this.fd });
      this.id = randomUUID();
      this.fd = ChargeJournal.create(this.dir, this.id);
      this.seq = 0;
      this.size = 0;
    }
    return { id: this.id, seq: this.seq, retiring: [...this.retiring] };
  }

  /**
   * In the flush's transaction: entries up to the mark are posted, with this sub-unit cost
   * carried per wallet and model (which covers the retired journals' entries too).
   */
  async checkpoint(tx: Tx, m: FlushMark, remainders: Remainders): Promise<void> {
    await tx`
      INSERT INTO inference_charge_journals (id, posted_seq, remainders) VALUES (${m.id}, ${m.seq}, ${tx.json(remainders)})
      ON CONFLICT (id) DO UPDATE SET posted_seq = EXCLUDED.posted_seq, remainders = EXCLUDED.remainders, updated_at = now()`;
    for (const r of m.retiring) {
      await tx`
        INSERT INTO inference_charge_journals (id, done) VALUES (${r.id}, true)
        ON CONFLICT (id) DO UPDATE SET done = true, updated_at = now()`;
    }
  }

  /** After the checkpoint committed: retired journals' files go. */
  committed(m: FlushMark): void {
    for (const r of m.retiring) {
      if (!this.retiring.includes(r)) continue; // kept or closed already (a flush that committed after a stop gave up)
      fs.closeSync(r.fd);
      fs.rmSync(ChargeJournal.file(this.dir, r.id), { force: true });
    }
    this.retiring = this.retiring.filter((r) => !m.retiring.includes(r));
  }

  /** Whether a checkpoint is owed even with nothing to charge (a journal waits to be retired). */
  get retiringPending(): boolean {
    return this.retiring.length > 0;
  }

  /** At a clean stop with everything posted: the journals are done and their files go. */
  async close(sql: Sql): Promise<void> {
    clearInterval(this.timer);
    this.sync();
    const all = [...this.retiring, { id: this.id, fd: this.fd }];
    await sql`UPDATE inference_charge_journals SET done = true, updated_at = now() WHERE id IN ${sql(all.map((j) => j.id))}`;
    for (const j of all) {
      fs.closeSync(j.fd);
      fs.rmSync(ChargeJournal.file(this.dir, j.id), { force: true });
    }
  }

  /** Keeps the files for the next start (the database could not take the charges); throws if they are not on disk. */
  keep(): void {
    clearInterval(this.timer);
    this.sync();
    for (const j of [...this.retiring, { id: this.id, fd: this.fd }]) fs.closeSync(j.fd);
    this.retiring = [];
  }
}

/** Posts entries over the carried remainders, final rounding; returns the units posted. */
export type PostEntries = (tx: Tx, entries: JournalEntry[], from: Remainders) => Promise<number>;

/** Posts what a previous daemon's journal holds past its checkpoint, marks it done, deletes it. */
async function recover(sql: Sql, file: string, post: PostEntries): Promise<void> {
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  let id: string | undefined;
  try {
    id = JSON.parse(lines[0] ?? '').journal;
  } catch {
    id = undefined;
  }
  if (!id) {
    log.error({ file }, 'charge journal without a header: left in place, not posted');
    return;
  }
  const entries: JournalEntry[] = [];
  for (const l of lines.slice(1)) {
    if (!l) continue;
    try {
      entries.push(JSON.parse(l));
    } catch {
      // A torn last line (a machine crash mid-write): that request was never answered whole.
      log.warn({ file }, 'charge journal: unreadable line skipped');
    }
  }
  const units = await sql.begin(async (tx) => {
    const [row] = await tx<{ posted_seq: string; remainders: Remainders; done: boolean }[]>`
      SELECT posted_seq, remainders, done FROM inference_charge_journals WHERE id = ${id} FOR UPDATE`;
    if (row?.done) return 0;
    const after = entries.filter((e) => e.s > Number(row?.posted_seq ?? 0));
    const posted = await post(tx, after, row?.remainders ?? {});
    const last = entries.length ? entries[entries.length - 1]!.s : 0;
    await tx`
      INSERT INTO inference_charge_journals (id, posted_seq, done) VALUES (${id}, ${last}, true)
      ON CONFLICT (id) DO UPDATE SET posted_seq = EXCLUDED.posted_seq, done = true, updated_at = now()`;
    return posted;
  });
  fs.rmSync(file, { force: true });
  log.info({ journal: id, units }, 'charge journal of a previous run posted');
}

/** One daemon per journal directory: a lock file names its pid; a dead owner's lock is taken over. */
function lockDir(dir: string): void {
  const lock = path.join(dir, 'daemon.lock');
  try {
    const pid = Number(fs.readFileSync(lock, 'utf8'));
    if (pid && pid !== process.pid && alive(pid)) throw new Error(`another daemon (pid ${pid}) uses the charge journal in ${dir}; give each daemon its own DATA_DIR`);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
  fs.writeFileSync(lock, String(process.pid));
}

/** A live process that is a Node program (a reused pid of something else is not an owner). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('node');
  } catch {
    return true;
  }
}
