import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDaemon, stopDaemon, type Started } from '../daemon.js';

// Issue 12.8: slow clients. A body trickled in is cut at BODY_TIMEOUT_MS (408, connection
// closed); one address may hold at most CLIENT_INFLIGHT_MAX requests. (Idle and header
// timeouts are uWebSockets' fixed 10 s: bench/faults.ts measures them; README says so.)

const BODY_TIMEOUT_MS = 500;

let d: Started;
beforeAll(async () => {
  d = await startDaemon({ BODY_TIMEOUT_MS: String(BODY_TIMEOUT_MS), CLIENT_INFLIGHT_MAX: '2' });
}, 60_000);
afterAll(async () => {
  if (d) await stopDaemon(d);
});

/** Opens a connection and sends a request head promising a body it does not send; resolves with what came back and when the socket closed. */
function trickle(port: number, promised = 100): { answer: Promise<{ text: string; closedAfterMs: number }>; socket: net.Socket } {
  const t0 = performance.now();
  const socket = net.connect(port, '127.0.0.1');
  let text = '';
  socket.on('data', (b) => (text += b.toString()));
  socket.write(`POST /api/admin/users HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${d.adminKey}\r\ncontent-type: application/json\r\ncontent-length: ${promised}\r\n\r\n{"name":`);
  const answer = new Promise<{ text: string; closedAfterMs: number }>((r) => {
    socket.on('close', () => r({ text, closedAfterMs: performance.now() - t0 }));
    socket.on('error', () => undefined);
  });
  return { answer, socket };
}

describe('slow and greedy clients', () => {
  it('answers a body that does not arrive in time with 408 and closes the connection', async () => {
    const port = Number(new URL(d.platformUrl).port);
    const { answer } = trickle(port);
    const r = await answer;
    expect(r.text).toMatch(/^HTTP\/1\.1 408/);
    expect(r.text).toMatch(/BODY_TIMEOUT_MS/);
    expect(r.closedAfterMs).toBeGreaterThanOrEqual(BODY_TIMEOUT_MS - 50);
    expect(r.closedAfterMs).toBeLessThan(BODY_TIMEOUT_MS + 3_000);
  });

  it('refuses a third request in flight from one address with 429', async () => {
    const port = Number(new URL(d.platformUrl).port);
    const held = [trickle(port), trickle(port)];
    await new Promise((r) => setTimeout(r, 100));
    const third = await fetch(`${d.platformUrl}/healthz`);
    expect(third.status).toBe(429);
    expect(((await third.json()) as { errors: Array<{ details: string }> }).errors[0]!.details).toMatch(/CLIENT_INFLIGHT_MAX/);
    await Promise.all(held.map((h) => h.answer));
    expect((await fetch(`${d.platformUrl}/healthz`)).status).toBe(200);
  });
});
