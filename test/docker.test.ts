import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { repoRoot } from './daemon.js';

// The Dockerfiles, checked without a Docker engine: what Kubernetes and
// `docker stop` need of them, and that the image's Node can load the HTTP
// server's native binary.

interface Instr {
  op: string;
  args: string;
}

/** Dockerfile instructions, line continuations joined, comments dropped. */
function parse(file: string): Instr[] {
  const text = fs.readFileSync(path.join(repoRoot, file), 'utf8');
  const out: Instr[] = [];
  let cur = '';
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (!cur && (line.trim().startsWith('#') || !line.trim())) continue;
    if (line.trim().startsWith('#')) continue;
    cur += (cur ? ' ' : '') + line.replace(/\\$/, '').trim();
    if (line.endsWith('\\')) continue;
    const m = /^(\w+)\s+(.*)$/.exec(cur);
    if (m) out.push({ op: m[1]!.toUpperCase(), args: m[2]! });
    cur = '';
  }
  return out;
}

/** The instructions of the last stage (the image that runs). */
const finalStage = (ins: Instr[]) => ins.slice(ins.map((i) => i.op).lastIndexOf('FROM'));

/** Node's module ABI by major version (process.versions.modules). */
const NODE_ABI: Record<string, number> = { '18': 108, '20': 115, '22': 127, '24': 137 };

describe.each(['Dockerfile', 'Dockerfile.gpu'])('%s', (file) => {
  const ins = parse(file);
  const stage = finalStage(ins);
  const one = (op: string) => stage.filter((i) => i.op === op).map((i) => i.args);

  it('runs as a numeric user (runAsNonRoot can check it) under tini, and stops on SIGTERM', () => {
    const user = one('USER').at(-1);
    expect(user).toMatch(/^\d+(:\d+)?$/);
    expect(Number(user!.split(':')[0])).toBeGreaterThan(0);
    expect(one('ENTRYPOINT').at(-1)).toBe('["/usr/bin/tini", "--"]');
    expect(stage.some((i) => i.op === 'RUN' && /apt-get install[^&]*\btini\b/.test(i.args))).toBe(true);
    expect(one('STOPSIGNAL')).toEqual(['SIGTERM']);
    expect(one('CMD').at(-1)).toBe('["node", "dist/src/main.js"]');
  });

  it('carries the OCI labels', () => {
    const labels = one('LABEL').join(' ');
    for (const k of ['title', 'description', 'source', 'licenses', 'version']) expect(labels).toContain(`org.opencontainers.image.${k}=`);
  });

  it('prunes native binaries for other systems from its node_modules', () => {
    expect(stage.some((i) => i.op === 'RUN' && i.args.includes('npm ci --omit=dev') && i.args.includes('prune-foreign-binaries.mjs node_modules'))).toBe(true);
  });

  it("builds on a Node whose ABI the HTTP server's native binary supports", () => {
    const arg = ins.find((i) => i.op === 'ARG' && i.args.startsWith('NODE_MAJOR='));
    const major = arg!.args.split('=')[1]!;
    const require = createRequire(import.meta.url);
    const uws = path.dirname(require.resolve('uWebSockets.js/package.json'));
    const abi = NODE_ABI[major];
    expect(abi, `Node ${major}`).toBeDefined();
    expect(fs.existsSync(path.join(uws, 'binaries', `uws_linux_x64_${abi}.node`)), `uws_linux_x64_${abi}.node for Node ${major}`).toBe(true);
  });
});

describe('prune-foreign-binaries', () => {
  it("removes darwin, win32 and other-CPU builds and keeps linux x64's", async () => {
    const { prune, isForeign } = (await import(path.join(repoRoot, 'deploy/prune-foreign-binaries.mjs'))) as {
      prune(root: string, arch: string, dryRun: boolean): string[];
      isForeign(rel: string, arch: string): boolean;
    };
    const gone = prune(path.join(repoRoot, 'node_modules'), 'x64', true);
    expect(gone.length).toBeGreaterThan(0);
    for (const rel of gone) expect(rel).toMatch(/darwin|win32|arm|ia32/);
    expect(gone).toContain(path.join('onnxruntime-node/bin/napi-v6/win32/x64/onnxruntime.dll'));
    expect(gone.some((g) => g.includes('uws_linux_x64'))).toBe(false);
    expect(isForeign('onnxruntime-node/bin/napi-v6/linux/x64/libonnxruntime.so.1', 'x64')).toBe(false);
    expect(isForeign('uWebSockets.js/binaries/uws_linux_x64_115.node', 'x64')).toBe(false);
    expect(isForeign('uWebSockets.js/binaries/uws_linux_arm64_115.node', 'x64')).toBe(true);
    expect(isForeign('uWebSockets.js/binaries/uws_linux_arm64_115.node', 'arm64')).toBe(false);
    expect(isForeign('some-pkg/index.js', 'x64')).toBe(false);
  });
});
