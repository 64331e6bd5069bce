-- 005_replay_leases: `ratchet dlq replay` keys idempotency by the dead
-- letter alone, records the dead letters it skips as duplicates of another
-- dead letter of the same source record (state 'duplicate'), remembers the
-- group and the topic each replay was for, and excludes concurrent runs of
-- one dead-letter topic with a lease row instead of a session advisory lock
-- (which a transaction-mode pooler such as PgBouncer cannot keep).

-- Rows written before this migration: their run skipped the duplicates of
-- a replayed source record without recording them. A later run treats a
-- dead letter of the same source record that failed before such a row was
-- done as one of those duplicates, so existing replays stay idempotent.
ALTER TABLE ratchet_replays ADD COLUMN legacy boolean NOT NULL DEFAULT true;
ALTER TABLE ratchet_replays ALTER COLUMN legacy SET DEFAULT false;

-- The group the replay is for (header ratchet.replay_group; NULL: unknown,
-- written before this migration) and the partition it was produced to
-- (the source partition unless --to-topic).
ALTER TABLE ratchet_replays ADD COLUMN replay_group text;
ALTER TABLE ratchet_replays ADD COLUMN to_topic text;
ALTER TABLE ratchet_replays ADD COLUMN to_partition int;
UPDATE ratchet_replays SET to_topic = topic, to_partition = partition;
ALTER TABLE ratchet_replays ALTER COLUMN to_topic SET NOT NULL;
ALTER TABLE ratchet_replays ALTER COLUMN to_partition SET NOT NULL;

ALTER TABLE ratchet_replays DROP CONSTRAINT ratchet_replays_state_check;
ALTER TABLE ratchet_replays ADD CONSTRAINT ratchet_replays_state_check
    CHECK (state IN ('pending', 'done', 'duplicate'));

-- One row per dead-letter topic being replayed: who holds it and until
-- when. The holder renews expires_at while it runs; a run killed with -9
-- stops renewing and the next run takes the row once it has expired.
CREATE TABLE ratchet_replay_leases (
    dlq_topic  text        PRIMARY KEY,
    owner      text        NOT NULL,
    expires_at timestamptz NOT NULL
);
