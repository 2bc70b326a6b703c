import { describe, expect, it } from 'vitest';
import { peerShares, WorkerPeers } from './peers.js';

describe('model workers sharing the cores', () => {
  it('tells a worker it is crowded once the others holding sequences take every core but one, never by its own', () => {
    const [s0, s1, s2] = peerShares(3, 2);
    const p0 = new WorkerPeers(s0), p1 = new WorkerPeers(s1), p2 = new WorkerPeers(s2);
    p0.stepping(3);
    expect(p0.crowded()).toBe(false);
    expect(p1.crowded()).toBe(true);
    expect(p2.crowded()).toBe(true);
    p0.stepping(0);
    expect(p1.crowded()).toBe(false);
    p2.stepping(1);
    expect(p0.crowded()).toBe(true);
    expect(new WorkerPeers().crowded()).toBe(false); // no share (a GPU model): never
  });

  it('leaves a worker every core while the busy ones are fewer than the cores', () => {
    const shares = peerShares(5, 4);
    const peers = shares.map((s) => new WorkerPeers(s));
    peers[1]!.stepping(2);
    expect(peers[0]!.crowded()).toBe(false); // one other busy on four cores: room for both
    peers[2]!.stepping(1);
    expect(peers[0]!.crowded()).toBe(false);
    peers[3]!.stepping(5);
    expect(peers[0]!.crowded()).toBe(true); // three others on four cores: one thread each
    expect(peers[4]!.crowded()).toBe(true);
  });

  it('shows a resting worker as holding none until it steps again, frees included', () => {
    const [s0, s1] = peerShares(2, 2);
    const p0 = new WorkerPeers(s0), p1 = new WorkerPeers(s1);
    p0.stepping(2);
    expect(p1.crowded()).toBe(true);
    p0.rest(); // its readers stopped reading: it holds 2 but runs no step
    expect(p1.crowded()).toBe(false);
    p0.freed(1); // one of them freed while resting: still none shown
    expect(p1.crowded()).toBe(false);
    p0.stepping(1);
    expect(p1.crowded()).toBe(true);
    p0.freed(0);
    expect(p1.crowded()).toBe(false);
    p0.stepping(3);
    p0.freed(2); // a free while stepping shows what is left
    expect(p1.crowded()).toBe(true);
  });
});
