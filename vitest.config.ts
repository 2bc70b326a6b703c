import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // e2e files share one daemon; run files in parallel only up to the 2 cores CI has
    maxWorkers: 2,
    fileParallelism: true,
  },
});
