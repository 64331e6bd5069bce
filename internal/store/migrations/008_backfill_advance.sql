-- 008_backfill_advance: a backfill's guarded position update as one
-- function that fails when it matches no row (as ratchet_advance does for
-- the live position), so that a backfill batch's transaction sends it with
-- its rows and its COMMIT at once: a position that moved, or a lease that
-- is no longer the caller's, aborts the transaction and nothing of the
-- batch is applied. The SQLSTATE RT409 is ratchet's own.

CREATE OR REPLACE FUNCTION ratchet_backfill_advance(
    p_group text, p_pipeline text, p_partition int, p_owner text,
    p_start bigint, p_next bigint, p_records bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ratchet_pipeline_backfills
    SET next_offset = p_next, records = records + p_records, updated_at = now()
    WHERE consumer_group = p_group AND pipeline = p_pipeline AND partition = p_partition
      AND next_offset = p_start
      AND EXISTS (SELECT 1 FROM ratchet_pipeline_backfill_leases l
                  WHERE l.consumer_group = p_group AND l.pipeline = p_pipeline
                    AND l.owner = p_owner AND l.expires_at > clock_timestamp());
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ratchet: backfill of pipeline % partition % from % refused (position moved or lease lost)',
            p_pipeline, p_partition, p_start
            USING ERRCODE = 'RT409';
    END IF;
END
$$;
