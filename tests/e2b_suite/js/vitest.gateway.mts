// Ours, not E2B's: their vitest.config.mts's `unit` project (the same isolation, timeout,
// environment and setup file), restricted to the sandbox and API tests the gateway is
// measured by. Their config also declares browser, Cloudflare and template projects, whose
// tools (Playwright, Wrangler) these tests do not need. The reporter writes a JUnit file
// when E2B_SUITE_JUNIT names one.
import { defineConfig } from 'vitest/config'

const junit = process.env.E2B_SUITE_JUNIT

export default defineConfig({
  test: {
    include: ['tests/sandbox/**/*.test.ts', 'tests/api/**/*.test.ts'],
    isolate: true,
    globals: false,
    testTimeout: 30_000,
    environment: 'node',
    bail: 0,
    // Most of these tests wait on the sandbox (sleeps, pauses, watches), not on this
    // process: three files at a time (E2B's default would be one on a 2-core machine).
    maxWorkers: 3,
    setupFiles: ['tests/globalFetchFallback.setup.ts'],
    deps: { interopDefault: true },
    reporters: junit ? ['default', 'junit'] : ['default'],
    outputFile: junit ? { junit } : undefined,
  },
})
