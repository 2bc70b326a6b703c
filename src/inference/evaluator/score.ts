import type { BranchSpec } from '../engine-api.js';

// Scoring answers of several tokens soundly. Each alternative is a token
// sequence; its log-probability is the sum, by the chain rule, of each token's
// log-probability given everything before it. Every distinct proper prefix of
// the alternatives (a trie) becomes one branch whose last-position
// distribution scores the next token of every alternative passing through it.
// When one alternative's tokens are a prefix of another's, each is closed with
// a terminator so that "pos" and "positive" are told apart. The result is
// normalised over the alternatives only.

/**
 * Lays out the questions as a radix tree under the shared prefix: leading tokens that several
 * questions share (a template's opening words, "Is the ...") become one branch, run once, that
 * their own tokens continue; a question that continues another's whole text continues its
 * branch. Returns, per question, the branch that ends where it ends: its answers hang from that
 * branch's last position (planAnswers). Parents are listed before their children.
 */
export function planQuestions(questions: number[][], out: BranchSpec[]): number[] {
  interface Node {
    children: Map<number, Node>;
    /** The questions that end at this token. */
    ends: number[];
  }
  const root: Node = { children: new Map(), ends: [] };
  questions.forEach((q, i) => {
    if (q.length === 0) throw new Error(`planQuestions: question ${i} has no tokens`);
    let n = root;
    for (const t of q) {
      let c = n.children.get(t);
      if (!c) n.children.set(t, (c = { children: new Map(), ends: [] }));
      n = c;
    }
    n.ends.push(i);
  });
  const endOf = new Array<number>(questions.length);
  // A branch runs down the trie until questions part there or one of them ends there.
  const emit = (token: number, from: Node, parent: number): void => {
    const tokens = [token];
    let n = from;
    while (n.children.size === 1 && n.ends.length === 0) {
      const [t, c] = n.children.entries().next().value!;
      tokens.push(t);
      n = c;
    }
    const i = out.length;
    out.push({ parent, tokens });
    for (const q of n.ends) endOf[q] = i;
    for (const [t, c] of n.children) emit(t, c, i);
  };
  for (const [t, c] of root.children) emit(t, c, -1);
  return endOf;
}

/**
 * Lays out one question's answers after its branch `question` (planQuestions): each trie node
 * adds one answer token to its parent node, so no token is run twice. `nodes`, shared by the
 * calls of one plan, lets questions that end on the same branch (asked twice, or identical
 * rotations) share their answers' nodes too. Returns, per alternative, the (branch, next token)
 * pairs whose log-probabilities sum to its score.
 */
export function planAnswers(question: number, alternatives: number[][], out: BranchSpec[], nodes = new Map<string, number>()): Array<Array<[number, number]>> {
  const nodeFor = (prefix: number[]): number => {
    if (prefix.length === 0) return question;
    const key = `${question}:${prefix.join(',')}`;
    let i = nodes.get(key);
    if (i === undefined) {
      const parent = nodeFor(prefix.slice(0, -1));
      i = out.length;
      out.push({ parent, tokens: [prefix[prefix.length - 1]!] });
      nodes.set(key, i);
    }
    return i;
  };
  return alternatives.map((alt) => alt.map((tok, i) => [nodeFor(alt.slice(0, i)), tok] as [number, number]));
}

export function needsTerminator(alternatives: number[][]): boolean {
  for (let a = 0; a < alternatives.length; a++) {
    for (let b = 0; b < alternatives.length; b++) {
      if (a === b) continue;
      const x = alternatives[a]!;
      const y = alternatives[b]!;
      if (x.length <= y.length && x.every((t, i) => y[i] === t)) return true;
    }
  }
  return false;
}

/** Softmax over summed log-probs, in float64; identical sequences share their mass equally. */
export function distribution(paths: Array<Array<[number, number]>>, logprobs: ArrayLike<number>[]): number[] {
  const scores = paths.map((p) => p.reduce((s, [b, tok]) => s + logprobs[b]![tok]!, 0));
  const max = Math.max(...scores);
  const exps = scores.map((s) => Math.exp(s - max));
  const sum = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => e / sum);
}

/** Longest common prefix length of token sequences. */
export function commonPrefix(seqs: number[][]): number {
  if (seqs.length === 0) return 0;
  let n = Math.min(...seqs.map((s) => s.length));
  const first = seqs[0]!;
  for (const s of seqs) {
    let i = 0;
    while (i < n && s[i] === first[i]) i++;
    n = i;
  }
  return n;
}
