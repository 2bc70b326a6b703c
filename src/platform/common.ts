import { unitsToUsd } from '../money/ledger.js';

// Small pieces every platform file uses: paging, money and time formats.

export const iso = (d: Date | null | undefined): string | null => (d ? d.toISOString() : null);

/** Stored units to a USD number for responses (ledger.ts converts; null stays null). */
export const usd = (units: number | null | undefined): number | null => (units === null || units === undefined ? null : unitsToUsd(units));
