-- 003_advance_function: the guarded offset update as one function that
-- fails when it matches no row, so a batch transaction can send it and its
-- COMMIT together: a refused advance aborts the transaction and the COMMIT
-- after it never applies. The SQLSTATE RT409 is ratchet's own.

CREATE OR REPLACE FUNCTION ratchet_advance(
    p_group text, p_topic text, p_partition int, p_epoch bigint, p_start bigint, p_next bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ratchet_offsets SET next_offset = p_next, updated_at = now()
    WHERE consumer_group = p_group AND topic = p_topic AND partition = p_partition
      AND epoch = p_epoch AND next_offset = p_start;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ratchet: offset advance of %[%] from % refused', p_topic, p_partition, p_start
            USING ERRCODE = 'RT409';
    END IF;
END
$$;
