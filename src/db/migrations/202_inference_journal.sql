-- Inference charge journals (src/inference/policy/charge-journal.ts): how far each
-- daemon's on-disk journal of usage has been posted to the ledger. Updated in the
-- same transaction as the charges it covers, so a journal replayed after a crash
-- posts each entry exactly once.
CREATE TABLE inference_charge_journals (
  id          text PRIMARY KEY,
  posted_seq  bigint NOT NULL DEFAULT 0,     -- entries up to this sequence number are in the ledger
  remainders  jsonb NOT NULL DEFAULT '{}',   -- sub-unit cost carried per wallet and model (1e-8 units)
  done        boolean NOT NULL DEFAULT false, -- every entry posted and the file may be deleted
  updated_at  timestamptz NOT NULL DEFAULT now()
);
