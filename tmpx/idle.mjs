import { startDaemon, stopDaemon } from '../dist/test/daemon.js';
import net from 'node:net';
const d = await startDaemon({});
const u = new URL(d.inferenceUrl);
for (let i = 0; i < 3; i++) {
  const s = net.connect(Number(u.port), '127.0.0.1');
  await new Promise((r) => s.once('connect', r));
  let got = '';
  const t0 = performance.now();
  s.on('data', (b) => { got += b; });
  s.write('GET /api/v1/models HTTP/1.1\r\nHost: x\r\n\r\n');
  await new Promise((r) => s.once('close', r));
  console.log('closed after', ((performance.now() - t0) / 1000).toFixed(2), 's; headers:', JSON.stringify(got.split('\r\n\r\n')[0]));
}
await stopDaemon(d);
