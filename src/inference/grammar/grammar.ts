// A context-free grammar over Unicode code points and an incremental matcher for it, in the
// manner of llama.cpp's grammar engine: a parse state is a set of stacks of positions in rule
// alternatives; a code point advances every stack whose next element accepts it. Constrained
// decoding asks, for each vocabulary token, whether its text keeps some stack alive.

/** A character class: inclusive code point ranges [lo0, hi0, lo1, hi1, ...]; `not` inverts it. */
export interface CharElem {
  k: 'c';
  r: number[];
  not?: boolean;
}
/** A reference to another rule (by index). */
export interface RefElem {
  k: 'r';
  id: number;
}
export type Elem = CharElem | RefElem;
/** A rule: alternatives, each a sequence of elements (an empty sequence matches nothing). */
export type Rule = Elem[][];

/** A compiled grammar: plain data, so it crosses to the model worker by structured clone. */
export interface Grammar {
  rules: Rule[];
  root: number;
}

/** A stack: the position to match next, and what follows when its sequence ends. */
interface Stack {
  rule: number;
  alt: number;
  i: number;
  next: Stack | null;
  key: string;
}
/** A parse state: the live stacks; `accepting` when some stack has matched the whole root. */
export interface State {
  stacks: Stack[];
  accepting: boolean;
}

/** Stacks in a state past this many are an ambiguity blow-up: the schema compiler keeps far below it. */
const STACKS_MAX = 4096;

export class Matcher {
  constructor(readonly g: Grammar) {}

  initial(): State {
    return this.expand([{ rule: this.g.root, alt: -1, i: 0, next: null, key: '' }].flatMap((s) => this.enter(s.rule, null)));
  }

  /** The stacks that begin each alternative of `rule`, continuing with `next`. */
  private enter(rule: number, next: Stack | null): Stack[] {
    return this.g.rules[rule]!.map((_, alt) => ({ rule, alt, i: 0, next, key: `${rule}.${alt}.0/${next?.key ?? ''}` }));
  }

  /** Resolves every stack until its top is a character class (or it is empty: accepted). */
  private expand(todo: Stack[]): State {
    const out: Stack[] = [];
    const seen = new Set<string>();
    let accepting = false;
    while (todo.length) {
      const s = todo.pop()!;
      if (seen.has(s.key)) continue;
      seen.add(s.key);
      const seq = this.g.rules[s.rule]![s.alt]!;
      if (s.i >= seq.length) {
        if (s.next === null) accepting = true;
        else todo.push(s.next);
        continue;
      }
      const e = seq[s.i]!;
      if (e.k === 'c') {
        out.push(s);
        if (out.length > STACKS_MAX) throw new Error(`grammar too ambiguous: more than ${STACKS_MAX} parse stacks`);
      } else {
        const after: Stack = { rule: s.rule, alt: s.alt, i: s.i + 1, next: s.next, key: `${s.rule}.${s.alt}.${s.i + 1}/${s.next?.key ?? ''}` };
        todo.push(...this.enter(e.id, after));
      }
    }
    return { stacks: out, accepting };
  }

  /** The state after code point `cp`, or null when no stack accepts it. */
  advance(st: State, cp: number): State | null {
    const moved: Stack[] = [];
    for (const s of st.stacks) {
      const e = this.g.rules[s.rule]![s.alt]![s.i] as CharElem;
      if (!classHas(e, cp)) continue;
      moved.push({ rule: s.rule, alt: s.alt, i: s.i + 1, next: s.next, key: `${s.rule}.${s.alt}.${s.i + 1}/${s.next?.key ?? ''}` });
    }
    if (!moved.length) return null;
    const r = this.expand(moved);
    return r.stacks.length || r.accepting ? r : null;
  }

  /** The state after a whole text, or null. */
  advanceText(st: State, text: string): State | null {
    let cur: State | null = st;
    for (const ch of text) {
      cur = this.advance(cur, ch.codePointAt(0)!);
      if (!cur) return null;
    }
    return cur;
  }
}

function classHas(e: CharElem, cp: number): boolean {
  let hit = false;
  for (let j = 0; j < e.r.length; j += 2) {
    if (cp >= e.r[j]! && cp <= e.r[j + 1]!) {
      hit = true;
      break;
    }
  }
  return e.not ? !hit : hit;
}

/**
 * Which tokens may come next: `allowed[t]` for each vocabulary text (null: never allowed,
 * e.g. a lone byte of a multi-byte character), and whether end of text may.
 * Tokens are grouped by their first code point so a class rejects a whole group at once.
 */
export class TokenMasker {
  private readonly byFirst = new Map<number, number[]>();
  constructor(
    readonly matcher: Matcher,
    private readonly texts: ReadonlyArray<string | null>,
  ) {
    texts.forEach((t, id) => {
      if (!t) return;
      const cp = t.codePointAt(0)!;
      const list = this.byFirst.get(cp);
      if (list) list.push(id);
      else this.byFirst.set(cp, [id]);
    });
  }

  /** Fills `allowed` (1 allowed, 0 not); returns how many tokens are allowed. */
  mask(st: State, allowed: Uint8Array): number {
    allowed.fill(0);
    let n = 0;
    for (const [cp, ids] of this.byFirst) {
      const after = this.matcher.advance(st, cp);
      if (!after) continue;
      for (const id of ids) {
        const t = this.texts[id]!;
        const first = String.fromCodePoint(cp).length;
        if (t.length === first || this.matcher.advanceText(after, t.slice(first))) {
          allowed[id] = 1;
          n++;
        }
      }
    }
    return n;
  }
}
