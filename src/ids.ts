import { randomUUID } from 'node:crypto';

/** Opaque resource ids: random UUIDs, so ids reveal nothing about counts or order. */
export const newId = (): string => randomUUID();
