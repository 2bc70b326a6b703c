-- Evaluation records and their samples. Samples are kept as pushed (JSONB),
-- numbered in push order per record so paged reads are stable.

CREATE TABLE evaluations (
  id             text PRIMARY KEY,
  user_id        text NOT NULL REFERENCES users(id),
  team_id        text REFERENCES teams(id),
  name           text NOT NULL,
  status         text NOT NULL,
  eval_type      text NOT NULL,
  environments   jsonb,
  suite_id       text,
  run_id         text,
  model_name     text,
  dataset        text,
  framework      text,
  task_type      text,
  description    text,
  tags           text[] NOT NULL DEFAULT '{}',
  metadata       jsonb,
  metrics        jsonb,
  is_public      boolean NOT NULL DEFAULT false,
  total_samples  integer NOT NULL DEFAULT 0,
  created_at     timestamptz NOT NULL DEFAULT now(),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  finalized_at   timestamptz
);
CREATE INDEX evaluations_user ON evaluations (user_id, created_at DESC, id);
CREATE INDEX evaluations_team ON evaluations (team_id, created_at DESC, id) WHERE team_id IS NOT NULL;

CREATE TABLE evaluation_samples (
  evaluation_id  text NOT NULL REFERENCES evaluations(id),
  seq            integer NOT NULL,
  data           jsonb NOT NULL,
  PRIMARY KEY (evaluation_id, seq)
);
