import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { MALLOC_AS_SHIPPED, repoRoot } from './daemon.js';

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

  it("sets glibc's malloc as the memory soak and the model steps measured it (docs/faults.md), as npm start and the test daemons do", () => {
    const env = one('ENV').join(' ');
    for (const [k, v] of Object.entries(MALLOC_AS_SHIPPED)) expect(env.split(/\s+/)).toContain(`${k}=${v}`);
  });

  it('carries the OCI labels', () => {
    const labels = one('LABEL').join(' ');
    for (const k of ['title', 'description', 'source', 'licenses', 'version']) expect(labels).toContain(`org.opencontainers.image.${k}=`);
  });

  it('prunes native binaries for other systems from its node_modules, after the HTTP server is in place', () => {
    const at = (pred: (i: Instr) => boolean) => stage.findIndex(pred);
    const ci = at((i) => i.op === 'RUN' && i.args.includes('npm ci --omit=dev'));
    const uws = at((i) => i.op === 'COPY' && i.args === '--from=build /app/node_modules/uWebSockets.js ./node_modules/uWebSockets.js');
    const prune = at((i) => i.op === 'RUN' && i.args.includes('prune-foreign-binaries.mjs node_modules'));
    expect(ci).toBeGreaterThan(-1);
    expect(uws).toBeGreaterThan(ci);
    expect(prune).toBeGreaterThan(uws);
    // The package npm ci installed is removed first: COPY merges directories.
    expect(stage[ci]!.args).toContain('rm -rf node_modules/uWebSockets.js');
  });

  it("runs Node 22 LTS with an HTTP server whose native binary carries Node 22's ABI", () => {
    const major = ins.find((i) => i.op === 'ARG' && i.args.startsWith('NODE_MAJOR='))!.args.split('=')[1]!;
    expect(major).toBe('22');
    const release = ins.find((i) => i.op === 'ARG' && i.args.startsWith('UWS_RELEASE='))!.args.split('=')[1]!;
    // uWebSockets.js releases with Node 22 (ABI 127) binaries: 20.49.0 added Node 22, 20.67.0 dropped Node 20.
    const [, minor] = /^v20\.(\d+)\.\d+$/.exec(release) ?? [];
    expect(Number(minor)).toBeGreaterThanOrEqual(49);
    // Its binaries need glibc 2.38: Debian 13 (trixie) or Ubuntu 24.04, not bookworm or 22.04.
    for (const from of ins.filter((i) => i.op === 'FROM')) expect(from.args).toMatch(/trixie|ubuntu24\.04/);
    const build = ins.find((i) => i.op === 'RUN' && i.args.startsWith('npm ci '))!;
    expect(build.args).toContain('"uWebSockets.js@github:uNetworking/uWebSockets.js#${UWS_RELEASE}"');
    // The build stops if the module it installed is not the native one.
    expect(build.args).toContain("require('uWebSockets.js').SSLApp || process.exit(1)");
  });
});

describe('Dockerfile.gpu', () => {
  const stage = finalStage(parse('Dockerfile.gpu'));
  it('runs the measured GPU path: webgpu, with the Vulkan loader and the driver capability that mounts its ICD', () => {
    const env = stage.filter((i) => i.op === 'ENV').map((i) => i.args).join(' ');
    expect(env).toMatch(/\bEXECUTION_PROVIDER=webgpu\b/);
    expect(env).toMatch(/\bNVIDIA_DRIVER_CAPABILITIES=\S*\bgraphics\b/);
    expect(stage.some((i) => i.op === 'RUN' && /apt-get install[^&]*\blibvulkan1\b/.test(i.args))).toBe(true);
  });
});

describe('npm start', () => {
  const start = (JSON.parse(fs.readFileSync(path.join(repoRoot, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts.start!;
  // The script's own shell line, with `env` where it starts the daemon: the environment the daemon gets.
  const envOfStart = (env: Record<string, string>) => {
    expect(start).toMatch(/exec node dist\/src\/main\.js$/);
    const line = start.replace(/exec node dist\/src\/main\.js$/, 'exec env');
    const out = execFileSync('sh', ['-c', line], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, encoding: 'utf8' });
    return Object.fromEntries(out.trim().split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
  };

  it("runs the daemon with the images' malloc settings", () => {
    const got = envOfStart({});
    for (const [k, v] of Object.entries(MALLOC_AS_SHIPPED)) expect(got[k]).toBe(v);
  });

  it("keeps the environment's own: its MALLOC_ARENA_MAX in place, its GLIBC_TUNABLES after the thread cache's (glibc takes a tunable's last value)", () => {
    const got = envOfStart({ MALLOC_ARENA_MAX: '4', GLIBC_TUNABLES: 'glibc.malloc.tcache_count=7' });
    expect(got.MALLOC_ARENA_MAX).toBe('4');
    expect(got.GLIBC_TUNABLES).toBe(`${MALLOC_AS_SHIPPED.GLIBC_TUNABLES}:glibc.malloc.tcache_count=7`);
  });
});

describe('npm ci (Node 20 outside the image)', () => {
  it("installs an HTTP server whose native binary carries this Node's ABI", () => {
    const require = createRequire(import.meta.url);
    const uws = path.dirname(require.resolve('uWebSockets.js/package.json'));
    expect(fs.existsSync(path.join(uws, 'binaries', `uws_linux_x64_${process.versions.modules}.node`))).toBe(true);
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
