-- The append-only ledger and the meters it is charged from.
-- Amounts are signed integers in USD x 10000: credits positive, debits negative.
-- A wallet's balance always equals the sum of its ledger rows (same transaction).

CREATE TABLE wallet_transactions (
  id                       text PRIMARY KEY,
  wallet_id                text NOT NULL REFERENCES wallets(id),
  amount                   bigint NOT NULL,
  balance_after            bigint NOT NULL,
  type                     text NOT NULL,
  description              text,
  ref_type                 text,
  ref_id                   text,
  provider_transaction_id  text UNIQUE,
  status                   text,
  created_at               timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX wallet_transactions_wallet ON wallet_transactions (wallet_id, created_at);
CREATE INDEX wallet_transactions_ref ON wallet_transactions (ref_type, ref_id);

-- Ledger rows are never updated or deleted (status of an invoice's transaction aside).
CREATE FUNCTION wallet_transactions_append_only() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN RAISE EXCEPTION 'wallet_transactions is append-only'; END IF;
  IF NEW.amount <> OLD.amount OR NEW.wallet_id <> OLD.wallet_id OR NEW.balance_after <> OLD.balance_after THEN
    RAISE EXCEPTION 'wallet_transactions amounts are immutable';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER wallet_transactions_append_only BEFORE UPDATE OR DELETE ON wallet_transactions
  FOR EACH ROW EXECUTE FUNCTION wallet_transactions_append_only();

-- A meter bills one resource at one hourly rate over [started_at, ended_at).
-- A state change closes the current meter and opens the next at the same instant.
-- charged_units is what the ledger already holds for it; metered_until how far.
CREATE TABLE meters (
  id                  text PRIMARY KEY,
  wallet_id           text NOT NULL REFERENCES wallets(id),
  resource_type       text NOT NULL,
  resource_id         text NOT NULL,
  state               text NOT NULL,
  rate_units_per_hr   bigint NOT NULL CHECK (rate_units_per_hr >= 0),
  started_at          timestamptz NOT NULL,
  ended_at            timestamptz,
  metered_until       timestamptz NOT NULL,
  charged_units       bigint NOT NULL DEFAULT 0,
  CHECK (ended_at IS NULL OR ended_at >= started_at)
);
CREATE UNIQUE INDEX meters_one_open ON meters (resource_type, resource_id) WHERE ended_at IS NULL;
CREATE INDEX meters_due ON meters (metered_until) WHERE ended_at IS NULL OR metered_until < ended_at;
CREATE INDEX meters_resource ON meters (resource_type, resource_id);
