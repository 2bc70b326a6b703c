import { unitsToUsd } from '../money/ledger.js';

// Money as the platform answers write it: USD numbers from stored units.

/** Stored units to a USD number for responses (ledger.ts converts; null stays null). */
export const usd = (units: number | null | undefined): number | null => (units === null || units === undefined ? null : unitsToUsd(units));
