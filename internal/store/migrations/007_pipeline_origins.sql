-- 007_pipeline_origins: where each pipeline began and what it was, so that
-- history from before can be backfilled exactly once, and a changed
-- definition is never mixed into a table silently (`ratchet pipelines
-- status|backfill|reset|forget`).

-- One row per pipeline and partition, written in the same transaction as
-- the first batch the pipeline applied live on that partition: live_from is
-- that batch's first offset. Everything before it is the backfill's range.
-- adopted: the pipeline was already running when its origin was first
-- recorded (the deployment predates this table), so what lies before
-- live_from may already be applied; a backfill refuses it.
CREATE TABLE ratchet_pipeline_origins (
    consumer_group text        NOT NULL,
    pipeline       text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL CHECK (partition >= 0),
    live_from      bigint      NOT NULL CHECK (live_from >= 0),
    live_since     timestamptz NOT NULL DEFAULT now(),
    fingerprint    text        NOT NULL,
    adopted        boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (consumer_group, pipeline, partition)
);

-- One row per pipeline: the fingerprint of the definition it was applied
-- with (a hash of what decides what is written, not of formatting) and
-- that definition in canonical form, to say what changed.
CREATE TABLE ratchet_pipeline_definitions (
    consumer_group text        NOT NULL,
    pipeline       text        NOT NULL,
    fingerprint    text        NOT NULL,
    definition     jsonb       NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, pipeline)
);

-- A backfill's position per partition, written in the same transaction as
-- the rows it applies: from_offset and to_offset (exclusive, the origin's
-- live_from) bound the range, next_offset is where a rerun continues.
CREATE TABLE ratchet_pipeline_backfills (
    consumer_group text        NOT NULL,
    pipeline       text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL CHECK (partition >= 0),
    from_offset    bigint      NOT NULL CHECK (from_offset >= 0),
    to_offset      bigint      NOT NULL CHECK (to_offset >= from_offset),
    next_offset    bigint      NOT NULL CHECK (next_offset >= from_offset AND next_offset <= to_offset),
    records        bigint      NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, pipeline, partition)
);

-- One row per pipeline being backfilled: who holds it and until when (a
-- lease, not a session lock, so that it works behind a transaction-mode
-- pooler). The holder renews expires_at; a killed run's lease expires.
CREATE TABLE ratchet_pipeline_backfill_leases (
    consumer_group text        NOT NULL,
    pipeline       text        NOT NULL,
    owner          text        NOT NULL,
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (consumer_group, pipeline)
);
