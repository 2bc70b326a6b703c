// Cross-origin access for browser clients (CORS_ORIGINS). Off by default: an API keyed by
// bearer secrets has no business being called from arbitrary pages unless the operator says so.

/** How long a browser may cache a preflight answer: 10 minutes, as common gateways do. */
export const CORS_PREFLIGHT_MAX_AGE_S = 600;
// Headers a browser script may read: ids for support, the rate-limit and retry headers SDKs use.
const EXPOSED = [
  'x-request-id', 'x-inference-id', 'retry-after', 'retry-after-ms', 'x-should-retry',
  'x-ratelimit-limit-requests', 'x-ratelimit-limit-tokens', 'x-ratelimit-remaining-requests',
  'x-ratelimit-remaining-tokens', 'x-ratelimit-reset-requests', 'x-ratelimit-reset-tokens',
].join(', ');
const METHODS = 'GET, POST, PUT, PATCH, DELETE, OPTIONS';

/** `*` or exact origins (`https://app.example.com`); an empty list turns CORS off. */
export type CorsOrigins = '*' | ReadonlySet<string>;

/** Parses CORS_ORIGINS; throws naming the entry that is not an origin. */
export function parseCorsOrigins(v: string): CorsOrigins {
  const items = v.split(',').map((s) => s.trim()).filter(Boolean);
  if (items.length === 1 && items[0] === '*') return '*';
  for (const o of items) {
    let u: URL | undefined;
    try {
      u = new URL(o);
    } catch {
      u = undefined;
    }
    if (!u || u.origin !== o) throw new Error(`${JSON.stringify(o)} is not an origin (scheme://host[:port], no path), or use * alone`);
  }
  return new Set(items);
}

/** Headers for an actual request from `origin`, or undefined when it is not allowed. */
export function corsHeaders(origins: CorsOrigins, origin: string | undefined): Record<string, string> | undefined {
  if (!origin || (origins !== '*' && !origins.has(origin))) return undefined;
  // Credentials are bearer headers, not cookies: no Allow-Credentials, and `*` may be sent as is.
  return { 'access-control-allow-origin': origins === '*' ? '*' : origin, vary: 'origin', 'access-control-expose-headers': EXPOSED };
}

/** The answer to a preflight from an allowed origin: the requested headers are allowed back. */
export function preflightHeaders(origins: CorsOrigins, origin: string | undefined, requestHeaders: string | undefined): Record<string, string> | undefined {
  const base = corsHeaders(origins, origin);
  if (!base) return undefined;
  return {
    ...base,
    'access-control-allow-methods': METHODS,
    'access-control-allow-headers': requestHeaders || 'authorization, content-type',
    'access-control-max-age': String(CORS_PREFLIGHT_MAX_AGE_S),
  };
}
