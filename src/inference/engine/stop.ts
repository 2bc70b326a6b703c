/**
 * Stop sequences on streamed text. Text is released as soon as no stop string
 * can still begin inside it: only the longest tail that is a prefix of some
 * stop string is held back. A match ends the stream; the stop string and
 * everything after it are never released.
 */
export class StopMatcher {
  private held = '';
  private readonly stops: string[];
  private readonly longest: number;

  constructor(stops: string[]) {
    this.stops = stops.filter((s) => s.length > 0);
    this.longest = this.stops.reduce((m, s) => Math.max(m, s.length), 0);
  }

  get active(): boolean {
    return this.stops.length > 0;
  }

  /** Adds decoded text; returns what may be emitted and whether a stop string was hit. */
  push(text: string): { out: string; stopped: boolean } {
    if (this.stops.length === 0) return { out: text, stopped: false };
    if (!text) return { out: '', stopped: false };
    const buf = this.held + text;
    // A match can only end inside the new text; search from where it could begin.
    const from = Math.max(0, this.held.length - this.longest + 1);
    let cut = -1;
    for (const s of this.stops) {
      const i = buf.indexOf(s, from);
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      this.held = '';
      return { out: buf.slice(0, cut), stopped: true };
    }
    let keep = 0;
    for (let n = Math.min(this.longest - 1, buf.length); n > 0; n--) {
      const tail = buf.slice(buf.length - n);
      if (this.stops.some((s) => s.startsWith(tail))) {
        keep = n;
        break;
      }
    }
    this.held = buf.slice(buf.length - keep);
    return { out: buf.slice(0, buf.length - keep), stopped: false };
  }

  /** At the end of generation (EOS or length) the held text is released: it did not become a stop string. */
  flush(): string {
    const out = this.held;
    this.held = '';
    return out;
  }
}
