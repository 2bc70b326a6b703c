import { loadUws } from '../src/http/uws.js';

// The baseline: uWebSockets.js answering fixed bytes, no routing, auth or logging.
const uws = loadUws();
const body = process.env.BARE_BODY ?? '{}';
const type = process.env.BARE_CONTENT_TYPE ?? 'application/json';
uws
  .App()
  .any('/*', (res) => {
    res.cork(() => {
      res.writeHeader('content-type', type);
      res.end(body);
    });
  })
  .listen('127.0.0.1', 0, (sock) => {
    if (!sock) process.exit(1);
    process.stdout.write(`${uws.us_socket_local_port(sock as never)}\n`);
  });
