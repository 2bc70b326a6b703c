import { createHash, randomBytes } from 'node:crypto';

// A key is `cg_` + 32 random bytes (base64url). Only its SHA-256 is stored:
// a leaked table leaks no usable key. Lookup is by hash (an index probe);
// the hash of a 256-bit secret is itself unguessable, so timing reveals nothing.

export function generateKey(): string {
  return `cg_${randomBytes(32).toString('base64url')}`;
}

export function hashKey(secret: string): Buffer {
  return createHash('sha256').update(secret, 'utf8').digest();
}

/** Shown in listings so an owner can tell keys apart; never enough to use. */
export const keyPrefix = (secret: string): string => secret.slice(0, 7);
