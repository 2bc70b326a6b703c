import { ecsFormat } from '@elastic/ecs-pino-format';
import { pino, type LoggerOptions } from 'pino';
import pretty from 'pino-pretty';

// One logger for the process. Secrets never reach it: the request logger
// records route, status and ids only, and these paths are redacted as a backstop.
//
// LOG_FORMAT (checked with the other settings in src/config.ts):
// - `json` (default): one JSON object per line, `level` as its name (`"info"`), as log
//   pipelines (Loki, Cloud Logging, Datadog) expect, not pino's number;
// - `ecs`: Elastic Common Schema (`@timestamp`, `log.level`, `message`), by Elastic's own
//   pino formatter, for Elasticsearch and Kibana without an ingest pipeline;
// - `pretty`: pino-pretty's human-readable lines, for a terminal (written synchronously).
export const LOG_FORMATS = ['json', 'ecs', 'pretty'] as const;
const format = (LOG_FORMATS as readonly string[]).includes(process.env.LOG_FORMAT ?? '') ? process.env.LOG_FORMAT : 'json';
const shape: LoggerOptions =
  format === 'ecs' ? ecsFormat({ apmIntegration: false }) : { formatters: { level: (label: string) => ({ level: label }) } };
const level = process.env.LOG_LEVEL ?? 'info';
const prettyStream = format === 'pretty' ? pretty({ sync: true, colorize: false }) : undefined;

const logOptions: LoggerOptions = {
  ...shape,
  level,
  base: { pid: process.pid },
  redact: {
    paths: ['authorization', '*.authorization', 'headers.authorization', 'apiKey', '*.apiKey', 'secret', '*.secret'],
    censor: '[redacted]',
  },
};
export const log = prettyStream ? pino(logOptions, prettyStream) : pino(logOptions);

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
export const accessLog = pino({ ...shape, level, base: { pid: process.pid } }, prettyStream ?? gathering);
setInterval(flushAccess, ACCESS_LOG_FLUSH_MS).unref();
process.on('exit', () => {
  flushAccess();
  try {
    accessDest.flushSync();
  } catch {
    // a write still in flight: nothing more can be done at exit
  }
});

