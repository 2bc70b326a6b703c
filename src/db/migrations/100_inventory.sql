-- Inventory: what the platform can rent out. Availability offers are computed
-- from these rows (free capacity of nodes under contract), never a static list.

-- A provider kind as clients see it (`provider` of an offer, `providerType` of a pod).
-- `driver` names the code that provisions on it (src/platform/providers/).
CREATE TABLE providers (
  id                  text PRIMARY KEY,
  name                text NOT NULL,
  driver              text NOT NULL DEFAULT 'simulated',
  max_disks_per_pod   integer NOT NULL CHECK (max_disks_per_pod >= 0),
  created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE data_centers (
  id           text PRIMARY KEY,
  provider_id  text NOT NULL REFERENCES providers(id),
  name         text NOT NULL,
  region       text NOT NULL,
  country      text NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX data_centers_region ON data_centers (region);

-- A contract is how the platform holds capacity from a provider; a node under no
-- contract is not rented out.
CREATE TABLE contracts (
  id           text PRIMARY KEY,
  provider_id  text NOT NULL REFERENCES providers(id),
  name         text NOT NULL,
  status       text NOT NULL DEFAULT 'ACTIVE',
  created_at   timestamptz NOT NULL DEFAULT now()
);

-- One machine. free_* are what pods have not reserved; a pod reservation is a
-- conditional UPDATE under the row lock, so they never go below zero.
CREATE TABLE nodes (
  id                 text PRIMARY KEY,
  provider_id        text NOT NULL REFERENCES providers(id),
  data_center_id     text NOT NULL REFERENCES data_centers(id),
  contract_id        text REFERENCES contracts(id),
  hostname           text,
  status             text NOT NULL DEFAULT 'ACTIVE',
  gpu_type           text NOT NULL,
  gpu_count          integer NOT NULL CHECK (gpu_count > 0),
  gpu_memory_gb      integer NOT NULL CHECK (gpu_memory_gb >= 0),
  socket             text NOT NULL,
  interconnect_gbps  integer,
  interconnect_type  text,
  vcpus              integer NOT NULL CHECK (vcpus > 0),
  memory_gb          integer NOT NULL CHECK (memory_gb > 0),
  disk_gb            integer NOT NULL CHECK (disk_gb > 0),
  free_gpus          integer NOT NULL,
  free_vcpus         integer NOT NULL,
  free_memory_gb     integer NOT NULL,
  free_disk_gb       integer NOT NULL,
  created_at         timestamptz NOT NULL DEFAULT now(),
  updated_at         timestamptz NOT NULL DEFAULT now(),
  CHECK (free_gpus >= 0 AND free_vcpus >= 0 AND free_memory_gb >= 0 AND free_disk_gb >= 0)
);
-- Placement looks for a rentable node of one kind in one data center with room.
CREATE INDEX nodes_placement ON nodes (data_center_id, gpu_type, socket, free_gpus)
  WHERE status = 'ACTIVE' AND contract_id IS NOT NULL;
CREATE INDEX nodes_contract ON nodes (contract_id);

-- Which contract held which node when: detaching ends the row, never deletes it.
CREATE TABLE contract_nodes (
  id           text PRIMARY KEY,
  contract_id  text NOT NULL REFERENCES contracts(id),
  node_id      text NOT NULL REFERENCES nodes(id),
  attached_at  timestamptz NOT NULL DEFAULT now(),
  detached_at  timestamptz
);
CREATE UNIQUE INDEX contract_nodes_open ON contract_nodes (node_id) WHERE detached_at IS NULL;
CREATE INDEX contract_nodes_contract ON contract_nodes (contract_id);

CREATE TABLE clusters (
  id              text PRIMARY KEY,
  name            text NOT NULL,
  data_center_id  text NOT NULL REFERENCES data_centers(id),
  created_at      timestamptz NOT NULL DEFAULT now()
);

-- A node's membership of a cluster. Status PENDING or ACTIVE while live, ENDED
-- once detached (kept as history); bulk delete removes rows outright.
CREATE TABLE cluster_assignments (
  id          text PRIMARY KEY,
  node_id     text NOT NULL REFERENCES nodes(id),
  cluster_id  text NOT NULL REFERENCES clusters(id),
  status      text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  ended_at    timestamptz
);
CREATE INDEX cluster_assignments_node ON cluster_assignments (node_id) WHERE ended_at IS NULL;
CREATE INDEX cluster_assignments_cluster ON cluster_assignments (cluster_id);

-- A rentable configuration: resource specs and prices of one GPU kind and count
-- in one data center. Specs are stored in the API's shape (prices in USD per
-- unit per hour); need_* are the defaults a placement must find room for.
CREATE TABLE gpu_offers (
  id                    text PRIMARY KEY,
  provider_id           text NOT NULL REFERENCES providers(id),
  data_center_id        text NOT NULL REFERENCES data_centers(id),
  cloud_id              text NOT NULL,
  gpu_type              text NOT NULL,
  gpu_count             integer NOT NULL CHECK (gpu_count > 0),
  gpu_memory_gb         integer NOT NULL,
  socket                text NOT NULL,
  security              text NOT NULL,
  disk_spec             jsonb NOT NULL,
  vcpu_spec             jsonb NOT NULL,
  memory_spec           jsonb NOT NULL,
  shared_disk_spec      jsonb,
  need_vcpus            integer NOT NULL,
  need_memory_gb        integer NOT NULL,
  need_disk_gb          integer NOT NULL,
  internet_speed        double precision,
  interconnect_gbps     integer,
  interconnect_type     text,
  provisioning_minutes  double precision,
  on_demand_units       bigint NOT NULL CHECK (on_demand_units >= 0),
  is_variable           boolean NOT NULL DEFAULT false,
  is_spot               boolean NOT NULL DEFAULT false,
  prepaid_hours         double precision,
  images                text[] NOT NULL,
  active                boolean NOT NULL DEFAULT true,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now(),
  UNIQUE (cloud_id, data_center_id, gpu_count)
);
CREATE INDEX gpu_offers_cloud ON gpu_offers (cloud_id, gpu_count);

-- Network disks: a storage pool per offer; free_gb is reserved by disk creation.
CREATE TABLE disk_offers (
  id              text PRIMARY KEY,
  provider_id     text NOT NULL REFERENCES providers(id),
  data_center_id  text NOT NULL REFERENCES data_centers(id),
  cloud_id        text,
  spec            jsonb NOT NULL,
  security        text NOT NULL,
  is_multinode    boolean NOT NULL DEFAULT false,
  capacity_gb     bigint NOT NULL CHECK (capacity_gb >= 0),
  free_gb         bigint NOT NULL CHECK (free_gb >= 0),
  active          boolean NOT NULL DEFAULT true,
  created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX disk_offers_dc ON disk_offers (data_center_id);

-- What admin inventory operations did, with a snapshot of removed rows.
CREATE TABLE inventory_audit (
  id             text PRIMARY KEY,
  operation_id   text NOT NULL,
  action         text NOT NULL,
  actor_user_id  text,
  actor_key_id   text,
  target_id      text,
  detail         jsonb NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inventory_audit_operation ON inventory_audit (operation_id);
