# syntax=docker/dockerfile:1
# cloudgate: one daemon, two ports (platform 8000, inference 8001), embedded PostgreSQL.
#
# Node: 22 LTS. The HTTP server that `npm ci` installs (uWebSockets.js, from npm
# as @trufflesuite/uws-js-unofficial 20.30.0) ships native binaries for Node ABIs
# 93, 108 and 115 only (Node 16, 18, 20): on Node 22 (ABI 127) the daemon would
# refuse to start rather than run on its slow JS fallback (src/http/uws.ts). The
# image therefore replaces it with uWebSockets.js's own release UWS_RELEASE, whose
# binaries carry ABI 127 but need glibc 2.38 or later: hence Debian 13 (trixie,
# glibc 2.41), not bookworm (2.36). `npm ci` and `npm start` outside the image stay
# on Node 20 with the npm package. Build with NODE_MAJOR=20 for the npm package
# alone (then UWS_RELEASE is not fetched).
# UNTESTED HERE: no Docker engine and no GitHub where this project is built;
# test/docker.test.ts checks the file, not a build.
ARG NODE_MAJOR=22
ARG UWS_RELEASE=v20.56.0

FROM node:${NODE_MAJOR}-trixie-slim AS build
ARG NODE_MAJOR
ARG UWS_RELEASE
WORKDIR /app
COPY package.json package-lock.json .npmrc ./
RUN npm ci \
 && if [ "$NODE_MAJOR" != 20 ]; then \
      npm install --no-save --ignore-scripts "uWebSockets.js@github:uNetworking/uWebSockets.js#${UWS_RELEASE}" \
      && node -e "require('uWebSockets.js').SSLApp || process.exit(1)"; \
    fi
COPY tsconfig.json ./
COPY src ./src
COPY bench ./bench
COPY test/daemon.ts ./test/daemon.ts
RUN npm run build \
 && node dist/src/inference/convert/default-models.js /app/models

FROM node:${NODE_MAJOR}-trixie-slim AS runtime
ARG VERSION=0.1.0
ARG TARGETARCH
LABEL org.opencontainers.image.title="cloudgate" \
      org.opencontainers.image.description="OpenAI-compatible inference gateway and evaluation engine with a GPU-cloud platform API" \
      org.opencontainers.image.source="https://github.com/cloudgate/cloudgate" \
      org.opencontainers.image.licenses="UNLICENSED" \
      org.opencontainers.image.version="${VERSION}"
# tini is PID 1: it forwards SIGTERM to the daemon and reaps the children that
# exit under it (the embedded PostgreSQL's processes), which node as PID 1 does not.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
# MALLOC_ARENA_MAX=2: glibc's per-thread malloc arenas fragment under the model workers'
# varied allocations (bench/README.md "Faults": an 8-minute soak grew 13.7 MiB/min in its
# second half with the default, 2.2 MiB/min with 2). A fixed mmap threshold
# (MALLOC_MMAP_THRESHOLD_=131072) flattened a soak but halved 16-stream decoding: not set
# (docs/faults.md "Memory").
# GLIBC_TUNABLES=glibc.malloc.tcache_count=1024: onnxruntime mallocs and frees ~1,000 small
# blocks a model step (~260 of one size at m25), past the per-thread cache's default 7 a size;
# the rest went through the shared arena's locks and coalescing, ~8-14 % of a model worker's
# time. With it one stream of m25 int4 read +4.8 %, m110 int4 +2.2 %, 16 streams of m25 int4
# +3.0 %, with the same memory (bench/README.md "malloc's thread cache").
ENV NODE_ENV=production \
    MALLOC_ARENA_MAX=2 \
    GLIBC_TUNABLES=glibc.malloc.tcache_count=1024 \
    HOST=0.0.0.0 \
    PORT=8000 \
    INFERENCE_PORT=8001 \
    DATA_DIR=/data \
    MODELS_DIR=/app/models
WORKDIR /app
COPY package.json package-lock.json .npmrc ./
COPY deploy/prune-foreign-binaries.mjs ./deploy/
# Production dependencies only, without the native binaries for other systems
# (onnxruntime-node's darwin/win32/arm64 builds alone are about 245 MiB).
RUN npm ci --omit=dev && rm -rf node_modules/uWebSockets.js && npm cache clean --force
# The HTTP server the build stage loaded on this Node (the release above, or npm's on Node 20).
COPY --from=build /app/node_modules/uWebSockets.js ./node_modules/uWebSockets.js
RUN node deploy/prune-foreign-binaries.mjs node_modules --arch "$([ "$TARGETARCH" = arm64 ] && echo arm64 || echo x64)" \
 && node -e "require('uWebSockets.js').SSLApp || process.exit(1)"
COPY --from=build /app/dist ./dist
COPY --from=build /app/models ./models
# Migrations are read from src/db/migrations at start.
COPY src/db/migrations ./src/db/migrations
# PostgreSQL refuses to run as root: the daemon and its embedded server run as
# the image's `node` user, by number so Kubernetes' runAsNonRoot can verify it.
RUN mkdir -p /data && chown 1000:1000 /data
USER 1000:1000
VOLUME ["/data"]
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD node -e "fetch('http://127.0.0.1:'+(process.env.PORT||8000)+'/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
# SIGTERM: stop accepting, let in-flight requests run SHUTDOWN_GRACE_MS (4 s),
# post the charges, stop PostgreSQL: under
# Docker's default 10 s. Give a longer --stop-timeout (Kubernetes:
# terminationGracePeriodSeconds) and raise SHUTDOWN_GRACE_MS to it minus 6 s
# for longer streams to finish.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["node", "dist/src/main.js"]
