# syntax=docker/dockerfile:1
# cloudgate: one daemon, two ports (platform 8000, inference 8001), embedded PostgreSQL.

FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json .npmrc ./
RUN npm ci
COPY tsconfig.json ./
COPY src ./src
COPY bench ./bench
COPY test/daemon.ts ./test/daemon.ts
RUN npm run build \
 && node dist/src/inference/convert/default-models.js /app/models

FROM node:20-bookworm-slim AS runtime
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=8000 \
    INFERENCE_PORT=8001 \
    DATA_DIR=/data \
    MODELS_DIR=/app/models
WORKDIR /app
COPY package.json package-lock.json .npmrc ./
RUN npm ci --omit=dev && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY --from=build /app/models ./models
# Migrations are read from src/db/migrations at start.
COPY src/db/migrations ./src/db/migrations
# PostgreSQL refuses to run as root: the daemon and its embedded server run as `node`.
RUN mkdir -p /data && chown node:node /data
USER node
VOLUME ["/data"]
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD node -e "fetch('http://127.0.0.1:'+(process.env.PORT||8000)+'/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
STOPSIGNAL SIGTERM
CMD ["node", "dist/src/main.js"]
