// How values are written in answers, in one place.

/** A time as ISO 8601 in UTC (`2026-11-25T07:30:00.000Z`); null stays null. */
export function iso(d: Date): string;
export function iso(d: Date | null | undefined): string | null;
export function iso(d: Date | null | undefined): string | null {
  return d ? d.toISOString() : null;
}
