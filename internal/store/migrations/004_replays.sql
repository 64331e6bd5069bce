-- 004_replays: `ratchet dlq replay` records each dead letter it re-produced,
-- keyed by where the dead letter is in its dead-letter topic, so a rerun
-- never replays it again. A row is written 'pending' before the record is
-- produced (with the source partition's end offset then, where a search for
-- it starts) and 'done' after its delivery report; a rerun resolves the
-- pending rows of an interrupted run by looking for the replayed record in
-- the source partition (header ratchet.replayed_from).

CREATE TABLE ratchet_replays (
    dlq_topic       text        NOT NULL,
    dlq_partition   int         NOT NULL,
    dlq_offset      bigint      NOT NULL,
    topic           text        NOT NULL,
    partition       int         NOT NULL,
    source_offset   bigint      NOT NULL,
    state           text        NOT NULL CHECK (state IN ('pending', 'done')),
    search_from     bigint      NOT NULL,
    replayed_offset bigint,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
);
