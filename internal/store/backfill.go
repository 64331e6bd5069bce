package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A backfill (`ratchet pipelines backfill NAME`) applies one pipeline to
// the records of its topic from before the pipeline began live, up to
// where it did (ratchet_pipeline_origins.live_from, exclusive). Its
// position per partition is a row of ratchet_pipeline_backfills, moved in
// the same transaction as the rows each batch writes (ApplyOptions.
// Backfill), so a killed run and a rerun apply every record of the range
// once. One backfill of a pipeline runs at a time: it holds a lease row of
// ratchet_pipeline_backfill_leases (LockBackfill), and the guarded update
// of the position checks that lease too.

// BackfillOrigin is where a pipeline began live on one partition, as
// ratchet_pipeline_origins records it.
type BackfillOrigin struct {
	Topic       string
	Partition   int32
	LiveFrom    int64
	LiveSince   time.Time
	Fingerprint string
	Adopted     bool
}

// BackfillOrigins returns the origins of pipeline in group, by partition.
func BackfillOrigins(ctx context.Context, pool *pgxpool.Pool, group, pipeline string) ([]BackfillOrigin, error) {
	rows, err := pool.Query(ctx, `
SELECT topic, partition, live_from, live_since, fingerprint, adopted FROM ratchet_pipeline_origins
WHERE consumer_group = $1 AND pipeline = $2 ORDER BY partition`, group, pipeline)
	if err != nil {
		return nil, fmt.Errorf("read origins of pipeline %s: %w", pipeline, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BackfillOrigin, error) {
		var o BackfillOrigin
		err := r.Scan(&o.Topic, &o.Partition, &o.LiveFrom, &o.LiveSince, &o.Fingerprint, &o.Adopted)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("read origins of pipeline %s: %w", pipeline, err)
	}
	return out, nil
}

// BackfillPosition is a backfill's range and position on one partition:
// records From..To-1, Next the first not applied yet, Records how many the
// backfill applied so far (records of the range a pipeline skipped, such
// as replays for another group, are not counted).
type BackfillPosition struct {
	Topic     string
	Partition int32
	From, To  int64
	Next      int64
	Records   int64
	UpdatedAt time.Time
}

// Remaining is how many offsets of the range are not applied yet.
func (p BackfillPosition) Remaining() int64 { return p.To - p.Next }

// Backfills returns the recorded positions of pipeline's backfill in
// group, by partition (none: no backfill was started).
func Backfills(ctx context.Context, pool *pgxpool.Pool, group, pipeline string) ([]BackfillPosition, error) {
	rows, err := pool.Query(ctx, `
SELECT topic, partition, from_offset, to_offset, next_offset, records, updated_at FROM ratchet_pipeline_backfills
WHERE consumer_group = $1 AND pipeline = $2 ORDER BY partition`, group, pipeline)
	if err != nil {
		return nil, fmt.Errorf("read backfill of pipeline %s: %w", pipeline, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BackfillPosition, error) {
		var p BackfillPosition
		err := r.Scan(&p.Topic, &p.Partition, &p.From, &p.To, &p.Next, &p.Records, &p.UpdatedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read backfill of pipeline %s: %w", pipeline, err)
	}
	return out, nil
}

// StartBackfill records the ranges of pipeline's backfill that are not
// recorded yet (Next = From, no records), in one transaction; a partition
// already recorded keeps its range and position. The caller holds the
// backfill's lease.
func StartBackfill(ctx context.Context, pool *pgxpool.Pool, group, pipeline string, ps []BackfillPosition) error {
	if len(ps) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, p := range ps {
		b.Queue(`
INSERT INTO ratchet_pipeline_backfills (consumer_group, pipeline, topic, partition, from_offset, to_offset, next_offset)
VALUES ($1, $2, $3, $4, $5, $6, $5)
ON CONFLICT (consumer_group, pipeline, partition) DO NOTHING`, group, pipeline, p.Topic, p.Partition, p.From, p.To)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
		return fmt.Errorf("record backfill of pipeline %s: %w", pipeline, err)
	}
	return nil
}

// BackfillStep moves a backfill's position in a batch's transaction (see
// ApplyOptions): from the batch's Start to its Next, adding Records, and
// only while Owner holds the backfill's lease and the position is still
// at Start. Otherwise the transaction is rolled back and ApplyWith returns
// an error wrapping ErrBackfillMoved.
type BackfillStep struct {
	Group, Pipeline, Owner string
	Records                int64
}

// ErrBackfillMoved means a backfill batch was refused: the recorded
// position is no longer where the batch starts, or the lease is no longer
// the caller's (another run took it over). Nothing of the batch was
// applied.
var ErrBackfillMoved = errors.New("backfill position moved or lease lost")

// ErrBackfillRunning means another run of the same pipeline's backfill
// holds its lease.
var ErrBackfillRunning = errors.New("another backfill of this pipeline is running")

// ErrBackfillLeaseLost is what Lease.Err wraps once a backfill must stop:
// its lease was taken by another run, or could not be renewed in time.
var ErrBackfillLeaseLost = errors.New("backfill lease lost")

// BackfillLeaseTTL is how long a backfill's lease lasts without renewal:
// a run killed with -9 blocks the next one for at most this long.
var BackfillLeaseTTL = 30 * time.Second

var backfillLeases = leaseTable{
	claim: `
INSERT INTO ratchet_pipeline_backfill_leases AS l (consumer_group, pipeline, owner, expires_at)
VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
ON CONFLICT (consumer_group, pipeline) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
WHERE l.expires_at < now() OR l.owner = EXCLUDED.owner
RETURNING owner, expires_at`,
	holder: `SELECT owner, expires_at FROM ratchet_pipeline_backfill_leases WHERE consumer_group = $1 AND pipeline = $2`,
	extend: `
UPDATE ratchet_pipeline_backfill_leases SET expires_at = now() + $4 * interval '1 millisecond'
WHERE consumer_group = $1 AND pipeline = $2 AND owner = $3`,
	release: `DELETE FROM ratchet_pipeline_backfill_leases WHERE consumer_group = $1 AND pipeline = $2 AND owner = $3`,
	lostErr: ErrBackfillLeaseLost,
	busyErr: ErrBackfillRunning,
}

// LockBackfill takes the lease of pipeline's backfill in group for owner,
// or returns ErrBackfillRunning at once while another run holds an
// unexpired one. Like LockReplays it is a row, not a session lock, so it
// works behind a transaction-mode pooler; it is renewed until Release or
// until ctx ends.
func LockBackfill(ctx context.Context, pool *pgxpool.Pool, group, pipeline, owner string) (*Lease, error) {
	return backfillLeases.lock(ctx, pool, "backfill of pipeline "+pipeline, owner, BackfillLeaseTTL, group, pipeline)
}

const backfillAdvanceSQL = `SELECT ratchet_backfill_advance($1, $2, $3, $4, $5, $6, $7)`
