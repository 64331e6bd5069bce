-- 001_initial: the dashboard processor's rollups and the exactly-once offset
-- store. Column names and types are contracts (see DESIGN.md); change them
-- only in a new migration with a note in the README.

CREATE TABLE dashboard_rollups (
    metric text             NOT NULL,
    bucket timestamptz      NOT NULL,
    count  bigint           NOT NULL,
    sum    double precision NOT NULL,
    min    double precision NOT NULL,
    max    double precision NOT NULL,
    PRIMARY KEY (metric, bucket)
);

-- The live page reads the most recent buckets of every metric.
CREATE INDEX dashboard_rollups_bucket_idx ON dashboard_rollups (bucket);

CREATE TABLE ratchet_offsets (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL CHECK (partition >= 0),
    next_offset    bigint      NOT NULL CHECK (next_offset >= 0),
    epoch          bigint      NOT NULL CHECK (epoch >= 1),
    owner          text        NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);
