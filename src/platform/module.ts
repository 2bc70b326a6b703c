import type { Module } from '../app.js';
import { adminRoutes } from './admin.js';
import { Providers } from './providers/index.js';
import { Reconciler } from './reconciler.js';
import { podReads } from './pod-reads.js';
import { platformRoutes } from './routes.js';
import { seed } from './seed.js';

// The platform API as a daemon module: seeds the catalog, starts the provider
// reconciler (stopped on shutdown), and serves the public and admin routes.
export const platformModule: Module = {
  name: 'platform',
  async init(s) {
    await seed(s.sql);
    const providers = new Providers(s.sql, s.config.PROVIDER_TIME_SCALE);
    const reconciler = new Reconciler(s.sql, providers);
    reconciler.start();
    s.onShutdown(() => reconciler.stop());
    const stopListening = await podReads.listen(s.sql);
    s.onShutdown(stopListening);
    const routes = [...platformRoutes(s.sql, providers, s.config.SAMPLES_BODY_BYTES_MAX), ...adminRoutes(s.sql, providers)];
    return { platform: routes };
  },
};

