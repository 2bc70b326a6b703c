import { describe, expect, it } from 'vitest';
import { TokenPosts, type StepTokens } from './token-posts.js';

const step = (tok: number): StepTokens => ({ seqs: [1], tokens: Int32Array.of(tok), madeAt: 0, stepMs: 1 });

describe('TokenPosts', () => {
  function setup(intervalMs = 3) {
    let t = 0;
    const posts: number[][] = [];
    const p = new TokenPosts((steps) => posts.push(steps.map((s) => s.tokens[0]!)), intervalMs, () => t);
    return { p, posts, at: (ms: number) => (t = ms) };
  }

  it('posts the first step at once, then holds fast steps until the interval has passed, in order', () => {
    const { p, posts, at } = setup(3);
    at(0);
    p.add(step(1), false);
    expect(posts).toEqual([[1]]);
    at(1.5);
    p.add(step(2), false);
    at(2.9);
    p.add(step(3), false);
    expect(posts).toEqual([[1]]);
    at(3.0);
    p.add(step(4), false);
    expect(posts).toEqual([[1], [2, 3, 4]]);
  });

  it('posts every step when steps are slower than the interval', () => {
    const { p, posts, at } = setup(3);
    for (let i = 0; i < 4; i++) {
      at(i * 8);
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
    expect(posts).toEqual([[1], [2, 3]]);
    at(2.5);
    p.add(step(4), false);
    p.flush();
    p.flush();
    expect(posts).toEqual([[1], [2, 3], [4]]);
  });
});
