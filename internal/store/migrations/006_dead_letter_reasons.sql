-- 006_dead_letter_reasons: the reason class, pipeline and SQLSTATE of a
-- dead letter (its ratchet.reason, ratchet.pipeline and ratchet.sqlstate
-- headers), so that the page groups dead letters by them rather than by
-- their text, which differs for every record. NULL on rows written before.

ALTER TABLE ratchet_dead_letters
    ADD COLUMN reason   text,
    ADD COLUMN pipeline text,
    ADD COLUMN sqlstate text;
