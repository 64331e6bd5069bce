-- 009_backfill_descending: a backfill that reads its range from the end
-- down. An upsert without upsert.version is backfilled that way: the
-- newest record of a key before the pipeline's origin is applied first,
-- and an older record writes a row only where the table has none (the
-- live pipeline's rows are all newer). Its position then moves down:
-- the records next_offset..to_offset-1 are applied, from_offset..
-- next_offset-1 remain, and a new range starts with next_offset =
-- to_offset.
ALTER TABLE ratchet_pipeline_backfills ADD COLUMN descending boolean NOT NULL DEFAULT false;
