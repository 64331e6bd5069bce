-- 002_dead_letters: in exactly-once mode every dead letter is recorded in
-- the transaction that moves the stored offset past it, so a record is
-- always either applied or dead-lettered, never neither.

CREATE TABLE ratchet_dead_letters (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL,
    "offset"       bigint      NOT NULL,
    error          text        NOT NULL,
    attempts       int         NOT NULL,
    dlq_topic      text        NOT NULL,
    failed_at      timestamptz NOT NULL,
    PRIMARY KEY (consumer_group, topic, partition, "offset")
);
