-- Principals, teams, wallets and API keys: what every other table points at.

CREATE TABLE users (
  id          text PRIMARY KEY,
  name        text NOT NULL,
  email       text NOT NULL UNIQUE,
  created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE teams (
  id               text PRIMARY KEY,
  name             text NOT NULL,
  slug             text NOT NULL UNIQUE,
  email            text,
  has_beta_access  boolean NOT NULL DEFAULT false,
  created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE team_members (
  team_id    text NOT NULL REFERENCES teams(id),
  user_id    text NOT NULL REFERENCES users(id),
  role       text NOT NULL CHECK (role IN ('ADMIN', 'MEMBER')),
  joined_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (team_id, user_id)
);
CREATE INDEX team_members_user ON team_members (user_id);

-- Money in units of USD x 10000. Exactly one owner per wallet.
CREATE TABLE wallets (
  id          text PRIMARY KEY,
  user_id     text UNIQUE REFERENCES users(id),
  team_id     text UNIQUE REFERENCES teams(id),
  balance     bigint NOT NULL DEFAULT 0,
  currency    text NOT NULL DEFAULT 'USD',
  created_at  timestamptz NOT NULL DEFAULT now(),
  CHECK ((user_id IS NULL) <> (team_id IS NULL))
);

CREATE TABLE api_keys (
  id           text PRIMARY KEY,
  user_id      text NOT NULL REFERENCES users(id),
  name         text,
  key_hash     bytea NOT NULL UNIQUE,
  key_prefix   text NOT NULL,
  permissions  text[] NOT NULL,
  rate_limits  jsonb,
  created_at   timestamptz NOT NULL DEFAULT now(),
  revoked_at   timestamptz
);
CREATE INDEX api_keys_user ON api_keys (user_id);
