import { pino } from 'pino';

// One JSON logger for the process. Secrets never reach it: the request logger
// records route, status and ids only, and these paths are redacted as a backstop.
/** `level` as its name (`"info"`), as log pipelines (Loki, Cloud Logging, ELK) expect, not pino's number. */
const formatters = { level: (label: string) => ({ level: label }) };

export const log = pino({
  level: process.env.LOG_LEVEL ?? 'info',
  formatters,
  base: { pid: process.pid },
  redact: {
    paths: ['authorization', '*.authorization', 'headers.authorization', 'apiKey', '*.apiKey', 'secret', '*.secret'],
    censor: '[redacted]',
  },
});

/**
 * The one-line-per-request log. Its lines hold only fields the server picks
 * (ids, route pattern, status, timing; never headers or bodies), so they skip
 * the redaction pass, which was a third of the cost of logging a request.
 * They are gathered up to ACCESS_LOG_BUFFER_BYTES (or for ACCESS_LOG_FLUSH_MS)
 * and handed to the stream in one write: a write per request cost as much as
 * the rest of the logging. An exit flushes them; a kill -9 loses at most the
 * last second of the access log.
 */
const ACCESS_LOG_BUFFER_BYTES = 8 * 1024; // a few dozen lines: one write(2) per ~40 requests
const ACCESS_LOG_FLUSH_MS = 1_000;
const accessDest = pino.destination({ dest: 1, sync: false });
const pending: string[] = [];
let pendingBytes = 0;
function flushAccess(): void {
  if (!pending.length) return;
  const chunk = pending.join('');
  pending.length = 0;
  pendingBytes = 0;
  accessDest.write(chunk);
}
const gathering = {
  write(line: string): void {
    pending.push(line);
    pendingBytes += line.length;
    if (pendingBytes >= ACCESS_LOG_BUFFER_BYTES) flushAccess();
  },
};
export const accessLog = pino({ level: process.env.LOG_LEVEL ?? 'info', base: { pid: process.pid }, formatters }, gathering);
setInterval(flushAccess, ACCESS_LOG_FLUSH_MS).unref();
process.on('exit', () => {
  flushAccess();
  try {
    accessDest.flushSync();
  } catch {
    // a write still in flight: nothing more can be done at exit
  }
});

