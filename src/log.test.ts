import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

// LOG_FORMAT picks the line format; the logger is built at import, so each format runs in its own process.
const logModule = path.resolve(import.meta.dirname, '../dist/src/log.js');
function firstLine(format: string): string {
  const script = `const { log } = await import(${JSON.stringify(logModule)}); log.info({ model: 'm' }, 'hello');`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { env: { ...process.env, LOG_FORMAT: format, LOG_LEVEL: 'info' }, encoding: 'utf8' });
  expect(r.status, r.stderr).toBe(0);
  return r.stdout.split('\n')[0]!;
}

describe('LOG_FORMAT', () => {
  it('json: level as its name, pino fields', () => {
    expect(JSON.parse(firstLine('json'))).toMatchObject({ level: 'info', msg: 'hello', model: 'm', pid: expect.any(Number) });
  });
  it('ecs: Elastic Common Schema fields', () => {
    expect(JSON.parse(firstLine('ecs'))).toMatchObject({ 'log.level': 'info', message: 'hello', model: 'm', 'ecs.version': expect.any(String), '@timestamp': expect.any(String) });
  });
  it('pretty: a human-readable line', () => {
    expect(firstLine('pretty')).toMatch(/^\[[\d:.]+\] INFO \(\d+\): hello$/);
  });
});
