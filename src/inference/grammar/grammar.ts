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

/** A stack: the position to match next, and what follows when its sequence ends. Interned: one object per distinct stack. */
interface Stack {
  id: number;
  rule: number;
  alt: number;
  i: number;
  next: Stack | null;
}
/**
 * A parse state: the live stacks; `accepting` when some stack has matched the whole root.
 * Interned too, so the same state reached twice (inside a string: after every ordinary
 * character) shares its transitions and its token mask.
 */
export interface State {
  readonly id: number;
  readonly stacks: readonly Stack[];
  readonly accepting: boolean;
  /** Memoised transitions by code point (null: refused). */
  readonly next: Map<number, State | null>;
}

/** Stacks in a state past this many are an ambiguity blow-up: the schema compiler keeps far below it. */
const STACKS_MAX = 4096;
/** Interned stacks and states kept per grammar before the tables start over (memory bound). */
const INTERNED_MAX = 200_000;

export class Matcher {
  private readonly stackTable = new Map<string, Stack>();
  private readonly stateTable = new Map<string, State>();
  private start: State | undefined;
  // Ids never repeat, not even after a reset: masks are cached by state id.
  private nextStackId = 0;
  private nextStateId = 0;

  constructor(readonly g: Grammar) {}

  initial(): State {
    return (this.start ??= this.expand(this.enter(this.g.root, null)));
  }

  private stack(rule: number, alt: number, i: number, next: Stack | null): Stack {
    const key = `${rule},${alt},${i},${next ? next.id : -1}`;
    let s = this.stackTable.get(key);
    if (!s) {
      if (this.stackTable.size >= INTERNED_MAX) this.reset();
      s = { id: this.nextStackId++, rule, alt, i, next };
      this.stackTable.set(key, s);
    }
    return s;
  }

  /** Drops the interning tables (states already handed out stay valid, just no longer shared). */
  private reset(): void {
    this.stackTable.clear();
    this.stateTable.clear();
    this.start = undefined;
  }

  /** The stacks that begin each alternative of `rule`, continuing with `next`. */
  private enter(rule: number, next: Stack | null): Stack[] {
    return this.g.rules[rule]!.map((_, alt) => this.stack(rule, alt, 0, next));
  }

  /** Resolves every stack until its top is a character class (or it is empty: accepted). */
  private expand(todo: Stack[]): State {
    const out: Stack[] = [];
    const seen = new Set<number>();
    let accepting = false;
    while (todo.length) {
      const s = todo.pop()!;
      if (seen.has(s.id)) continue;
      seen.add(s.id);
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
        todo.push(...this.enter(e.id, this.stack(s.rule, s.alt, s.i + 1, s.next)));
      }
    }
    out.sort((a, b) => a.id - b.id);
    const key = `${accepting ? 'a' : ''}${out.map((x) => x.id).join(',')}`;
    let st = this.stateTable.get(key);
    if (!st) {
      st = { id: this.nextStateId++, stacks: out, accepting, next: new Map() };
      this.stateTable.set(key, st);
    }
    return st;
  }

  /** The state after code point `cp`, or null when no stack accepts it. */
  advance(st: State, cp: number): State | null {
    const memo = st.next.get(cp);
    if (memo !== undefined) return memo;
    const moved: Stack[] = [];
    for (const s of st.stacks) {
      const e = this.g.rules[s.rule]![s.alt]![s.i] as CharElem;
      if (classHas(e, cp)) moved.push(this.stack(s.rule, s.alt, s.i + 1, s.next));
    }
    let r: State | null = null;
    if (moved.length) {
      const x = this.expand(moved);
      r = x.stacks.length || x.accepting ? x : null;
    }
    st.next.set(cp, r);
    return r;
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

interface TrieNode {
  /** Tokens whose text ends here. */
  ids: number[];
  kids: Map<number, TrieNode>;
}

/** Masks kept per grammar, by state (the same states recur in every document of a schema). */
const MASKS_CACHED_MAX = 4096;

/**
 * Which tokens may come next, over the vocabulary's texts (null: never allowed, e.g. a lone
 * byte of a multi-byte character). The texts sit in a trie, so a prefix refused by the grammar
 * refuses every token under it at once; masks are cached per parse state.
 */
export class TokenMasker {
  private readonly root: TrieNode = { ids: [], kids: new Map() };
  private readonly masks = new Map<number, { allowed: Uint8Array; n: number }>();
  constructor(
    readonly matcher: Matcher,
    texts: ReadonlyArray<string | null>,
  ) {
    texts.forEach((t, id) => {
      if (!t) return;
      let node = this.root;
      for (const c of t) {
        const cp = c.codePointAt(0)!;
        let k = node.kids.get(cp);
        if (!k) node.kids.set(cp, (k = { ids: [], kids: new Map() }));
        node = k;
      }
      node.ids.push(id);
    });
  }

  /** Fills `allowed` (1 allowed, 0 not); returns how many tokens are allowed. */
  mask(st: State, allowed: Uint8Array): number {
    const hit = this.masks.get(st.id);
    if (hit && hit.allowed.length === allowed.length) {
      allowed.set(hit.allowed);
      return hit.n;
    }
    allowed.fill(0);
    let n = 0;
    const walk = (node: TrieNode, s: State) => {
      for (const [cp, kid] of node.kids) {
        const next = this.matcher.advance(s, cp);
        if (!next) continue;
        for (const id of kid.ids) allowed[id] = 1;
        n += kid.ids.length;
        walk(kid, next);
      }
    };
    walk(this.root, st);
    if (this.masks.size >= MASKS_CACHED_MAX) this.masks.clear();
    this.masks.set(st.id, { allowed: allowed.slice(), n });
    return n;
  }
}
