// Deletes native binaries built for other operating systems or CPUs from
// node_modules (onnxruntime-node ships darwin, win32 and arm64 builds, about
// 245 MiB; uWebSockets.js 18 builds; ws helpers their prebuilds), so an image
// holds only what runs on it. Usage: node prune-foreign-binaries.mjs DIR
// [--arch x64] [--dry-run]; prints each path it removes (or would remove).
import fs from 'node:fs';
import path from 'node:path';

const NATIVE = /\.(node|so(\.\d+)*|dylib|dll|exe)$/;
const OS_TOKENS = ['darwin', 'macos', 'osx', 'win32', 'windows', 'freebsd', 'android'];
const ARCH_TOKENS = ['x64', 'arm64', 'aarch64', 'arm', 'armv7', 'ia32', 'x86', 'ppc64', 's390x', 'riscv64'];

/** Whether a native file's path names another OS, or a CPU other than `arch` (and not `arch` too). */
export function isForeign(rel, arch = 'x64') {
  if (!NATIVE.test(rel)) return false;
  const tokens = rel.toLowerCase().split(/[\\/_\-.+]/);
  if (tokens.some((t) => OS_TOKENS.includes(t))) return true;
  const arches = tokens.filter((t) => ARCH_TOKENS.includes(t));
  return arches.length > 0 && !arches.includes(arch);
}

function* walk(dir) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) yield* walk(p);
    else if (e.isFile()) yield p;
  }
}

export function prune(root, arch = 'x64', dryRun = false) {
  const removed = [];
  for (const file of walk(root)) {
    const rel = path.relative(root, file);
    if (!isForeign(rel, arch)) continue;
    removed.push(rel);
    if (!dryRun) fs.rmSync(file);
  }
  return removed;
}

if (process.argv[1] && import.meta.url === new URL(`file://${path.resolve(process.argv[1])}`).href) {
  const args = process.argv.slice(2);
  const root = args.find((a) => !a.startsWith('--')) ?? 'node_modules';
  const archAt = args.indexOf('--arch');
  const arch = archAt >= 0 ? args[archAt + 1] : 'x64';
  for (const rel of prune(root, arch, args.includes('--dry-run'))) console.log(rel);
}
