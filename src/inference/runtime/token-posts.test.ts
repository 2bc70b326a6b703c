import { describe, expect, it } from 'vitest';
import { postsAtOnce, showsText, TOKENS_POSTED_AT_ONCE, TokenPosts, type StepTokens } from './token-posts.js';

const step = (tok: number): StepTokens => ({ seqs: [1], tokens: Int32Array.of(tok), madeAt: 0, stepMs: 1 });

describe('TokenPosts', () => {
  function setup(intervalMs = 3) {
    let t = 0;
    const posts: number[][] = [];
    const p = new TokenPosts((steps) => posts.push(steps.map((s) => s.tokens[0]!)), intervalMs, () => t);
    return { p, posts, at: (ms: number) => (t = ms) };
  }

  it('holds fast steps until the interval has passed since the run began, then since the last post, in order', () => {
    const { p, posts, at } = setup(3);
    at(1);
    p.add(step(1), false);
    at(2.9);
    p.add(step(2), false);
    expect(posts).toEqual([]);
    at(3.0);
    p.add(step(3), false);
    expect(posts).toEqual([[1, 2, 3]]);
    at(5.9);
    p.add(step(4), false);
    expect(posts).toEqual([[1, 2, 3]]);
    at(6.0);
    p.add(step(5), false);
    expect(posts).toEqual([[1, 2, 3], [4, 5]]);
  });

  it('posts every step when steps are slower than the interval', () => {
    const { p, posts, at } = setup(3);
    for (let i = 0; i < 4; i++) {
      at((i + 1) * 8);
      p.add(step(i), false);
    }
    expect(posts).toEqual([[0], [1], [2], [3]]);
  });

  it('posts an urgent step with what is held before it, and flush empties the rest once', () => {
    const { p, posts, at } = setup(3);
    at(0);
    p.add(step(1), false);
    at(1);
    p.add(step(2), false);
    at(2);
    p.add(step(3), true);
    expect(posts).toEqual([[1, 2, 3]]);
    at(2.5);
    p.add(step(4), false);
    p.flush();
    p.flush();
    expect(posts).toEqual([[1, 2, 3], [4]]);
  });
});

describe('which steps go out at once', () => {
  it('counts a token as showing text where its piece has a character other than white space', () => {
    for (const piece of [' the', 'a', '.', '\u00e9', ' \ud83d\ude42']) expect(showsText(piece)).toBe(true);
    // A byte token or a special one (null), no text, and blank pieces (a first token's leading space is dropped).
    for (const piece of [null, undefined, '', ' ', '\n', ' \t']) expect(showsText(piece)).toBe(false);
  });

  it('posts a young sequence at once until its text shows, and an ended one always', () => {
    expect(postsAtOnce({ made: 2, ended: false, shown: false })).toBe(true);
    expect(postsAtOnce({ made: TOKENS_POSTED_AT_ONCE, ended: false, shown: false })).toBe(true);
    expect(postsAtOnce({ made: TOKENS_POSTED_AT_ONCE + 1, ended: false, shown: false })).toBe(false);
    expect(postsAtOnce({ made: 2, ended: false, shown: true })).toBe(false);
    expect(postsAtOnce({ made: 2, ended: true, shown: true })).toBe(true);
    expect(postsAtOnce({ made: 40, ended: true, shown: true })).toBe(true);
  });
});
