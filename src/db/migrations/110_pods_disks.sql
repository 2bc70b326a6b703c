-- Pods and network disks. Prices are stored in units of USD x 10000 per hour.
-- A deleted pod keeps its row with terminated_at set: that row is its history
-- record, and the partial indexes keep the live lists as small as the live set.

CREATE TABLE pods (
  id                           text PRIMARY KEY,
  user_id                      text NOT NULL REFERENCES users(id),
  team_id                      text REFERENCES teams(id),
  wallet_id                    text NOT NULL REFERENCES wallets(id),
  name                         text NOT NULL,
  provider_id                  text NOT NULL REFERENCES providers(id),
  provider_ref                 text,
  offer_id                     text NOT NULL REFERENCES gpu_offers(id),
  node_id                      text NOT NULL REFERENCES nodes(id),
  data_center_id               text NOT NULL,
  country                      text NOT NULL,
  cloud_id                     text NOT NULL,
  security                     text NOT NULL,
  cluster_id                   text,
  type                         text NOT NULL DEFAULT 'HOSTED',
  status                       text NOT NULL,
  installation_status          text NOT NULL,
  installation_failure         text,
  installation_progress        integer,
  gpu_name                     text NOT NULL,
  gpu_count                    integer NOT NULL,
  socket                       text NOT NULL,
  price_hr_units               bigint NOT NULL,
  stopped_price_hr_units       bigint,
  provisioning_price_hr_units  bigint NOT NULL,
  environment_type             text NOT NULL,
  custom_template_id           text,
  port_mapping                 jsonb NOT NULL DEFAULT '[]',
  ssh_connection               text,
  ip                           text,
  vcpus                        integer NOT NULL,
  memory_gb                    integer NOT NULL,
  disk_gb                      integer NOT NULL,
  shared_disk_gb               integer,
  is_spot                      boolean,
  auto_restart                 boolean,
  shared_with_team             boolean NOT NULL DEFAULT false,
  max_price_units              bigint,
  provisioning_minutes         double precision NOT NULL,
  prepaid_until                timestamptz,
  -- provider polling: pods still changing are polled at next_poll_at
  needs_poll                   boolean NOT NULL DEFAULT true,
  next_poll_at                 timestamptz NOT NULL DEFAULT now(),
  created_at                   timestamptz NOT NULL,
  updated_at                   timestamptz NOT NULL,
  active_at                    timestamptz,
  terminated_at                timestamptz
);
CREATE INDEX pods_live_user ON pods (user_id, created_at DESC, id) WHERE terminated_at IS NULL;
CREATE INDEX pods_live_team_shared ON pods (team_id) WHERE terminated_at IS NULL AND shared_with_team;
CREATE INDEX pods_history_user ON pods (user_id, terminated_at DESC, id) WHERE terminated_at IS NOT NULL;
CREATE INDEX pods_history_team_shared ON pods (team_id) WHERE terminated_at IS NOT NULL AND shared_with_team;
CREATE INDEX pods_poll ON pods (next_poll_at) WHERE needs_poll AND terminated_at IS NULL;

-- Team members a pod is shared with (teamMemberIds), beside its owner.
CREATE TABLE pod_shares (
  pod_id   text NOT NULL REFERENCES pods(id),
  user_id  text NOT NULL REFERENCES users(id),
  PRIMARY KEY (pod_id, user_id)
);
CREATE INDEX pod_shares_user ON pod_shares (user_id);

CREATE TABLE disks (
  id              text PRIMARY KEY,
  user_id         text NOT NULL REFERENCES users(id),
  team_id         text REFERENCES teams(id),
  wallet_id       text NOT NULL REFERENCES wallets(id),
  name            text NOT NULL,
  offer_id        text NOT NULL REFERENCES disk_offers(id),
  provider_id     text NOT NULL REFERENCES providers(id),
  provider_ref    text,
  data_center_id  text NOT NULL,
  country         text NOT NULL,
  cloud_id        text,
  is_multinode    boolean NOT NULL,
  size_gb         integer NOT NULL CHECK (size_gb > 0),
  price_hr_units  bigint NOT NULL,
  status          text NOT NULL,
  ready_at        timestamptz,
  created_at      timestamptz NOT NULL,
  updated_at      timestamptz NOT NULL,
  terminated_at   timestamptz
);
CREATE INDEX disks_live_user ON disks (user_id, created_at DESC, id) WHERE terminated_at IS NULL;
CREATE INDEX disks_live_team ON disks (team_id) WHERE terminated_at IS NULL;
CREATE INDEX disks_provisioning ON disks (ready_at) WHERE status = 'PROVISIONING';

-- A disk on a pod. status: UNATTACHED, ATTACHED, MOUNTED. detached_at is set on
-- pod termination to the moment detachment completes; until then the disk is in use.
CREATE TABLE pod_disks (
  pod_id       text NOT NULL REFERENCES pods(id),
  disk_id      text NOT NULL REFERENCES disks(id),
  position     integer NOT NULL,
  status       text NOT NULL,
  mount_path   text NOT NULL,
  attached_at  timestamptz,
  mounted_at   timestamptz,
  detached_at  timestamptz,
  PRIMARY KEY (pod_id, disk_id)
);
CREATE INDEX pod_disks_disk ON pod_disks (disk_id);
