import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { repoRoot } from './daemon.js';

// deploy/ cannot be run here (no container engine), so its files are checked: they parse,
// carry the fields their tools require, and agree with the Dockerfile (ports, probes) and
// with each other (image, labels, pool target).

const read = (p: string) => fs.readFileSync(path.join(repoRoot, p), 'utf8');
const dockerfile = read('Dockerfile');

/** The runtime stage's EXPOSEd ports and its PORT / INFERENCE_PORT defaults. */
function dockerPorts() {
  const runtime = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '));
  const exposed = [...runtime.matchAll(/^EXPOSE\s+(.+)$/gm)].flatMap((m) => m[1]!.trim().split(/\s+/).map(Number));
  const env = (name: string) => Number(new RegExp(`\\b${name}=(\\d+)`).exec(runtime)?.[1]);
  return { exposed, platform: env('PORT'), inference: env('INFERENCE_PORT') };
}

type Doc = { apiVersion: string; kind: string; metadata: { name: string; labels?: Record<string, string> }; spec?: any; data?: any; stringData?: any };
function k8sDocs(): Doc[] {
  const dir = path.join(repoRoot, 'deploy/k8s');
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.yaml'))
    .flatMap((f) =>
      parseAllDocuments(fs.readFileSync(path.join(dir, f), 'utf8')).map((d) => {
        expect(d.errors, f).toEqual([]);
        return d.toJSON() as Doc;
      }),
    );
}
const one = (docs: Doc[], kind: string) => {
  const found = docs.filter((d) => d.kind === kind);
  expect(found.length, kind).toBe(1);
  return found[0]!;
};

describe('deploy recipes', () => {
  const ports = dockerPorts();

  it('reads the Dockerfile the recipes must agree with', () => {
    expect(ports.platform).toBeGreaterThan(0);
    expect(ports.inference).toBeGreaterThan(0);
    expect(ports.exposed.sort()).toEqual([ports.platform, ports.inference].sort());
  });

  it('compose: three replicas of one image on one database, nginx publishing both ports to all three', () => {
    const c = parse(read('deploy/compose.yaml'), { merge: true });
    const replicas = Object.entries<any>(c.services).filter(([, s]) => s.build);
    expect(replicas.length).toBe(3);
    const images = new Set(replicas.map(([, s]) => s.image));
    expect(images.size).toBe(1);
    for (const [name, s] of replicas) {
      expect(path.resolve(repoRoot, 'deploy', s.build.context, s.build.dockerfile), name).toBe(path.join(repoRoot, 'Dockerfile'));
      expect(Number(s.environment.PORT), name).toBe(ports.platform);
      expect(Number(s.environment.INFERENCE_PORT), name).toBe(ports.inference);
      expect(s.environment.DATABASE_URL, name).toMatch(/^postgres:\/\/.+@postgres:5432\//);
      expect(s.environment.ADMIN_API_KEY, name).toBeTruthy();
      expect(s.expose.map(Number).sort(), name).toEqual(ports.exposed.sort());
      expect(s.depends_on.postgres.condition, name).toBe('service_healthy');
      expect(s.environment.REDIS_URL, name).toMatch(/^redis:\/\/redis:6379/);
      expect(s.depends_on.redis.condition, name).toBe('service_healthy');
      expect(s.volumes?.[0], name).toMatch(/:\/data$/);
    }
    // Each replica its own DATA_DIR volume (the charge journal is per daemon).
    expect(new Set(replicas.map(([, s]) => s.volumes[0].split(':')[0])).size).toBe(3);
    expect(c.services.postgres.healthcheck.test.join(' ')).toContain('pg_isready');
    const nginx = c.services.nginx;
    expect(nginx.ports.map((p: string) => p.split(':').map(Number))).toEqual([
      [ports.platform, ports.platform],
      [ports.inference, ports.inference],
    ]);
    expect(nginx.volumes[0]).toMatch(/^\.\/nginx\.conf:\/etc\/nginx\/nginx\.conf/);

    const conf = read('deploy/nginx.conf');
    for (const port of [ports.platform, ports.inference]) {
      expect(conf).toContain(`listen ${port};`);
      for (const [name] of replicas) expect(conf).toContain(`server ${name}:${port}`);
    }
    // Server-sent events pass frame by frame on the inference port.
    const inferenceServer = conf.slice(conf.indexOf(`listen ${ports.inference};`));
    expect(inferenceServer).toContain('proxy_buffering off;');
  });

  it('kubernetes: Deployment probes, Service, PDB, config, secret and InferencePool agree', () => {
    const docs = k8sDocs();
    for (const d of docs) {
      expect(d.apiVersion, d.kind).toBeTruthy();
      expect(d.metadata?.name, d.kind).toBeTruthy();
    }
    const dep = one(docs, 'Deployment');
    expect(dep.apiVersion).toBe('apps/v1');
    const labels = dep.spec.selector.matchLabels;
    expect(dep.spec.template.metadata.labels).toMatchObject(labels);
    expect(dep.spec.replicas).toBeGreaterThanOrEqual(2);
    const [ctr] = dep.spec.template.spec.containers;
    const named = Object.fromEntries(ctr.ports.map((p: { name: string; containerPort: number }) => [p.name, p.containerPort]));
    expect(named).toEqual({ platform: ports.platform, inference: ports.inference });
    expect(ctr.livenessProbe.httpGet).toMatchObject({ path: '/healthz', port: 'platform' });
    expect(ctr.readinessProbe.httpGet).toMatchObject({ path: '/readyz', port: 'platform' });
    // The image runs as a non-root user (PostgreSQL refuses root); the pod says so too, as the same uid when the Dockerfile names one.
    expect(dep.spec.template.spec.securityContext.runAsNonRoot).toBe(true);
    const user = /^USER\s+(\S+)/m.exec(dockerfile.slice(dockerfile.lastIndexOf('\nFROM ')))?.[1];
    if (user && /^\d+/.test(user)) expect(dep.spec.template.spec.securityContext.runAsUser).toBe(Number(user.split(':')[0]));
    // The image the Compose recipe builds is the one the Deployment runs.
    const compose = parse(read('deploy/compose.yaml'), { merge: true });
    expect(ctr.image).toBe(compose.services['cloudgate-1'].image);

    const cm = one(docs, 'ConfigMap');
    const secret = one(docs, 'Secret');
    expect(ctr.envFrom).toEqual([{ configMapRef: { name: cm.metadata.name } }, { secretRef: { name: secret.metadata.name } }]);
    expect(Number(cm.data.PORT)).toBe(ports.platform);
    expect(Number(cm.data.INFERENCE_PORT)).toBe(ports.inference);
    expect(Object.keys(secret.stringData).sort()).toEqual(['ADMIN_API_KEY', 'DATABASE_URL']);

    const svc = one(docs, 'Service');
    expect(svc.spec.selector).toEqual(labels);
    expect(svc.spec.ports.map((p: { port: number; targetPort: string }) => [p.targetPort, p.port])).toEqual([
      ['platform', ports.platform],
      ['inference', ports.inference],
    ]);

    const pdb = one(docs, 'PodDisruptionBudget');
    expect(pdb.apiVersion).toBe('policy/v1');
    expect(pdb.spec.selector.matchLabels).toEqual(labels);
    expect(pdb.spec.minAvailable).toBeLessThan(dep.spec.replicas);

    const pool = one(docs, 'InferencePool');
    expect(pool.apiVersion).toBe('inference.networking.k8s.io/v1');
    expect(pool.spec.selector.matchLabels).toEqual(labels);
    expect(pool.spec.targetPorts).toEqual([{ number: ports.inference }]);
    expect(pool.spec.endpointPickerRef.name).toBeTruthy();
    expect(pool.spec.endpointPickerRef.port.number).toBeGreaterThan(0);
  });
});
