import { UNITS_PER_USD } from '../money/ledger.js';

// Small pieces every platform file uses: paging, money and time formats.

export const iso = (d: Date | null | undefined): string | null => (d ? d.toISOString() : null);

/** Stored units (USD x 10000) to a USD number for responses. */
export const usd = (units: number | null | undefined): number | null =>
  units === null || units === undefined ? null : units / UNITS_PER_USD;

/** A USD amount to stored units; prices are rounded to the stored resolution. */
export const units = (usdAmount: number): number => Math.round(usdAmount * UNITS_PER_USD);
