import fs from 'node:fs';
import type { TestProject } from 'vitest/node';
import { startDaemon, stopDaemon, type DaemonInfo } from './daemon.js';

// One shared daemon for the end-to-end files; tests that restart or kill a
// daemon start their own.
declare module 'vitest' {
  export interface ProvidedContext {
    daemon: DaemonInfo;
  }
}

export default async function setup(project: TestProject) {
  const d = await startDaemon();
  project.provide('daemon', {
    platformUrl: d.platformUrl,
    inferenceUrl: d.inferenceUrl,
    adminKey: d.adminKey,
    dataDir: d.dataDir,
    pid: d.pid,
    logFile: d.logFile,
  });
  return async () => {
    const code = await stopDaemon(d);
    if (code !== 0) console.error(`shared daemon exited with ${code}; log: ${d.logFile}`);
    else fs.rmSync(d.dataDir, { recursive: true, force: true });
  };
}
