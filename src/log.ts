import { pino } from 'pino';

// One JSON logger for the process. Secrets never reach it: the request logger
// records route, status and ids only, and these paths are redacted as a backstop.
export const log = pino({
  level: process.env.LOG_LEVEL ?? 'info',
  base: { pid: process.pid },
  redact: {
    paths: ['authorization', '*.authorization', 'headers.authorization', 'apiKey', '*.apiKey', 'secret', '*.secret'],
    censor: '[redacted]',
  },
});

export type Logger = typeof log;
