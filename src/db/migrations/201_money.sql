-- Money beyond the ledger core: idempotency keys of the admin top-up, billing
-- summaries per resource, invoices, and RFT runs with their usage records.
-- Amounts in units of USD x 10000; prices per million tokens in micro-USD.

-- A retried request with the same key replays the first answer. The key row is
-- inserted in the transaction that posts the credit, so a key exists exactly
-- when its effect does.
CREATE TABLE idempotency_keys (
  scope            text NOT NULL,        -- caller and route: keys of different callers never collide
  key              text NOT NULL,
  request_hash     text NOT NULL,        -- sha256 of the normalised request
  response_status  integer,
  response_body    text,                 -- the JSON sent, byte for byte
  created_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

-- What `GET /api/v1/billing/wallet` lists: charges summed per resource,
-- maintained by postTransaction in the same transaction as each charge.
CREATE TABLE billings (
  id              text PRIMARY KEY,
  wallet_id       text NOT NULL REFERENCES wallets(id),
  resource_type   text NOT NULL,         -- compute, disks, inference, training
  resource_id     text NOT NULL,
  amount_units    bigint NOT NULL,       -- positive: what the resource cost so far
  charges         bigint NOT NULL,       -- ledger rows summed here
  created_at      timestamptz NOT NULL,
  last_billed_at  timestamptz NOT NULL,
  UNIQUE (wallet_id, resource_type, resource_id)
);
CREATE INDEX billings_recent ON billings (wallet_id, last_billed_at DESC, id);

-- Charges already in the ledger when this migration runs get their summaries too.
INSERT INTO billings (id, wallet_id, resource_type, resource_id, amount_units, charges, created_at, last_billed_at)
SELECT gen_random_uuid()::text, wallet_id,
       CASE ref_type WHEN 'pod' THEN 'compute' WHEN 'disk' THEN 'disks' WHEN 'model' THEN 'inference' ELSE 'training' END,
       ref_id, -sum(amount), count(*), min(created_at), max(created_at)
FROM wallet_transactions
WHERE type IN ('POD_CHARGE', 'DISK_CHARGE', 'PREPAID_CHARGE', 'INFERENCE_CHARGE', 'TRAINING_CHARGE') AND ref_id IS NOT NULL
GROUP BY wallet_id, ref_type, ref_id;

-- An invoice covers a wallet's charges with created_at in [period_start, period_end).
-- Periods of one wallet follow each other without gaps or overlap (issued under
-- the wallet's row lock). Its ledger row (type INVOICE, amount 0) carries the
-- external id and the status, so VOID is recorded on its transaction.
CREATE TABLE invoices (
  id                       text PRIMARY KEY,
  wallet_id                text NOT NULL REFERENCES wallets(id),
  provider_transaction_id  text NOT NULL UNIQUE,
  transaction_id           text NOT NULL UNIQUE REFERENCES wallet_transactions(id),
  status                   text NOT NULL CHECK (status IN ('OPEN', 'PAID', 'VOID')),
  amount_units             bigint NOT NULL CHECK (amount_units >= 0),
  currency                 text NOT NULL DEFAULT 'USD',
  period_start             timestamptz NOT NULL,
  period_end               timestamptz NOT NULL,
  lines                    jsonb NOT NULL,
  created_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
  paid_at                  timestamptz,
  voided_at                timestamptz,
  CHECK (period_end > period_start)
);
CREATE INDEX invoices_wallet ON invoices (wallet_id, period_end DESC);

-- RFT runs: prices snapshotted at creation, never changed afterwards.
CREATE TABLE rft_runs (
  id                            text PRIMARY KEY,
  name                          text NOT NULL,
  base_model                    text NOT NULL,
  status                        text NOT NULL,
  user_id                       text NOT NULL REFERENCES users(id),
  team_id                       text REFERENCES teams(id),
  wallet_id                     text NOT NULL REFERENCES wallets(id),
  training_price_micro          bigint NOT NULL CHECK (training_price_micro >= 0),
  inference_input_price_micro   bigint NOT NULL CHECK (inference_input_price_micro >= 0),
  inference_output_price_micro  bigint NOT NULL CHECK (inference_output_price_micro >= 0),
  -- Usage charged to the wallet at the run's prices, as sum(tokens x price_micro);
  -- the ledger holds floor(billed_numerator / 1e8) units of it (charged_units).
  billed_numerator              numeric NOT NULL DEFAULT 0,
  charged_units                 bigint NOT NULL DEFAULT 0,
  created_at                    timestamptz NOT NULL DEFAULT now(),
  updated_at                    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rft_runs_user ON rft_runs (user_id);
CREATE INDEX rft_runs_team ON rft_runs (team_id) WHERE team_id IS NOT NULL;

-- One row per recorded batch of usage: an admin record (training, or inference
-- run outside the gateway) or an inference flush of requests carrying X-RFT-Run-ID.
CREATE TABLE rft_usage (
  id               bigserial PRIMARY KEY,
  run_id           text NOT NULL REFERENCES rft_runs(id),
  source           text NOT NULL CHECK (source IN ('admin', 'gateway')),
  training_tokens  bigint NOT NULL DEFAULT 0 CHECK (training_tokens >= 0),
  input_tokens     bigint NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
  output_tokens    bigint NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX rft_usage_run ON rft_usage (run_id);

-- The conservation check, runnable any time: wallets whose balance is not the sum of their ledger.
CREATE VIEW wallet_ledger_mismatches AS
SELECT w.id AS wallet_id, w.balance, COALESCE(t.total, 0) AS ledger_total
FROM wallets w
LEFT JOIN (SELECT wallet_id, sum(amount) AS total FROM wallet_transactions GROUP BY wallet_id) t ON t.wallet_id = w.id
WHERE w.balance <> COALESCE(t.total, 0);
