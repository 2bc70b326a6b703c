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
 * Lays out one question's branches: the question itself continues the shared
 * prefix, and each trie node adds one answer token to its parent node, so no
 * token is run twice. Returns, per alternative, the (branch, next token) pairs
 * whose log-probabilities sum to its score.
 */
export function planBranches(question: number[], alternatives: number[][], out: BranchSpec[]): Array<Array<[number, number]>> {
  const root = out.length;
  out.push({ parent: -1, tokens: question });
  const index = new Map<string, number>([['', root]]);
  const nodeFor = (prefix: number[]): number => {
    const key = prefix.join(',');
    let i = index.get(key);
    if (i === undefined) {
      const parent = nodeFor(prefix.slice(0, -1));
      i = out.length;
      out.push({ parent, tokens: [prefix[prefix.length - 1]!] });
      index.set(key, i);
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
