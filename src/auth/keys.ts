import { hash, randomBytes } from 'node:crypto';

// A key is `cg_` + 32 random bytes (base64url). Only its SHA-256 is stored:
// a leaked table leaks no usable key. Lookup is by hash (an index probe);
// the hash of a 256-bit secret is itself unguessable, so timing reveals nothing.

export function generateKey(): string {
  return `cg_${randomBytes(32).toString('base64url')}`;
}

// crypto.hash is the one-shot form: about 5x cheaper than createHash() per
// call, which matters because every authenticated request hashes its key.
export function hashKey(secret: string): Buffer {
  return hash('sha256', secret, 'buffer');
}

/** The same digest in base64, as the in-memory cache key (no Buffer made on a hit). */
export function hashKeyB64(secret: string): string {
  return hash('sha256', secret, 'base64');
}

/** Shown in listings so an owner can tell keys apart; never enough to use. */
export const keyPrefix = (secret: string): string => secret.slice(0, 7);
