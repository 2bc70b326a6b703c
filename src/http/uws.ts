import { createRequire } from 'node:module';
import type * as UWS from 'uWebSockets.js';

// The npm alias of uWebSockets.js silently falls back to a slow pure-JS shim
// when its native binary does not load for this Node ABI. The shim would pass
// every functional test and halve throughput, so we refuse to run on it.
const require = createRequire(import.meta.url);

export type { HttpRequest, HttpResponse, TemplatedApp, us_listen_socket } from 'uWebSockets.js';

export class NativeUwsMissing extends Error {}

let loaded: typeof UWS | undefined;

export function loadUws(): typeof UWS {
  if (loaded) return loaded;
  const warn = console.warn;
  const warnings: string[] = [];
  // The package prints its fallback notice through console.warn; capture it for our message.
  console.warn = (...args: unknown[]) => warnings.push(args.map(String).join(' '));
  let mod: typeof UWS;
  try {
    mod = require('uWebSockets.js') as typeof UWS;
  } finally {
    console.warn = warn;
  }
  // The native addon exports SSLApp/H3App and getParts; the JS fallback exports none of them.
  const native = typeof (mod as unknown as Record<string, unknown>).SSLApp === 'function';
  if (!native || process.env.UWS_USE_FALLBACK) {
    throw new NativeUwsMissing(
      `uWebSockets.js native binary did not load for node ${process.version} ` +
        `(ABI ${process.versions.modules}, ${process.platform}-${process.arch}); refusing to start on the slow JS fallback.` +
        (warnings.length ? `\n${warnings.join('\n')}` : ''),
    );
  }
  loaded = mod;
  return mod;
}
