package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/processor"
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
// as replays for another group, are not counted). A Descending backfill
// reads its range from the end down: Next..To-1 are applied, From..Next-1
// remain.
type BackfillPosition struct {
	Topic      string
	Partition  int32
	From, To   int64
	Next       int64
	Records    int64
	Descending bool
	UpdatedAt  time.Time
}

// Remaining is how many offsets of the range are not applied yet.
func (p BackfillPosition) Remaining() int64 {
	if p.Descending {
		return p.Next - p.From
	}
	return p.To - p.Next
}

// Backfills returns the recorded positions of pipeline's backfill in
// group, by partition (none: no backfill was started).
func Backfills(ctx context.Context, pool *pgxpool.Pool, group, pipeline string) ([]BackfillPosition, error) {
	rows, err := pool.Query(ctx, `
SELECT topic, partition, from_offset, to_offset, next_offset, records, descending, updated_at FROM ratchet_pipeline_backfills
WHERE consumer_group = $1 AND pipeline = $2 ORDER BY partition`, group, pipeline)
	if err != nil {
		return nil, fmt.Errorf("read backfill of pipeline %s: %w", pipeline, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BackfillPosition, error) {
		var p BackfillPosition
		err := r.Scan(&p.Topic, &p.Partition, &p.From, &p.To, &p.Next, &p.Records, &p.Descending, &p.UpdatedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read backfill of pipeline %s: %w", pipeline, err)
	}
	return out, nil
}

// StartBackfill records the ranges of pipeline's backfill that are not
// recorded yet (Next = From, or To when Descending; no records), in one
// transaction; a partition already recorded keeps its range, direction
// and position. The caller holds the backfill's lease.
func StartBackfill(ctx context.Context, pool *pgxpool.Pool, group, pipeline string, ps []BackfillPosition) error {
	if len(ps) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, p := range ps {
		next := p.From
		if p.Descending {
			next = p.To
		}
		b.Queue(`
INSERT INTO ratchet_pipeline_backfills (consumer_group, pipeline, topic, partition, from_offset, to_offset, next_offset, descending)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (consumer_group, pipeline, partition) DO NOTHING`, group, pipeline, p.Topic, p.Partition, p.From, p.To, next, p.Descending)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
		return fmt.Errorf("record backfill of pipeline %s: %w", pipeline, err)
	}
	return nil
}

// BackfillStep moves a backfill's position in a batch's transaction (see
// ApplyOptions): from the batch's Start to its Next (from its Next down to
// its Start when Descending), adding Records, and only while Owner holds
// the backfill's lease and the position is still where the step starts.
// Otherwise the transaction is rolled back and ApplyWith returns an error
// wrapping ErrBackfillMoved.
type BackfillStep struct {
	Group, Pipeline, Owner string
	Records                int64
	Descending             bool
}

// positions returns where the step moves the position of b's partition
// from, and to.
func (s *BackfillStep) positions(b processor.Batch) (from, to int64) {
	if s.Descending {
		return b.Next, b.Start
	}
	return b.Start, b.Next
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

// BackfillProgress is one partition of a pipeline's backfill as the live
// engine exports it: its recorded position, and whether a run holds the
// backfill's lease.
type BackfillProgress struct {
	Pipeline string
	BackfillPosition
	Running bool
}

// BackfillsOfGroup returns the recorded positions of every pipeline's
// backfill in group, by pipeline and partition, each with whether a run
// holds its lease now (by the database's clock).
func BackfillsOfGroup(ctx context.Context, pool *pgxpool.Pool, group string) ([]BackfillProgress, error) {
	rows, err := pool.Query(ctx, `
SELECT b.pipeline, b.topic, b.partition, b.from_offset, b.to_offset, b.next_offset, b.records, b.descending, b.updated_at,
       coalesce(l.expires_at > clock_timestamp(), false)
FROM ratchet_pipeline_backfills b
LEFT JOIN ratchet_pipeline_backfill_leases l ON l.consumer_group = b.consumer_group AND l.pipeline = b.pipeline
WHERE b.consumer_group = $1 ORDER BY b.pipeline, b.partition`, group)
	if err != nil {
		return nil, fmt.Errorf("read backfills of group %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BackfillProgress, error) {
		var p BackfillProgress
		err := r.Scan(&p.Pipeline, &p.Topic, &p.Partition, &p.From, &p.To, &p.Next, &p.Records, &p.Descending, &p.UpdatedAt, &p.Running)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read backfills of group %s: %w", group, err)
	}
	return out, nil
}

// OriginsAtRest returns where pipeline would begin on the partitions of
// topic where it has no origin yet and the group is at rest: its stored
// position (exactly-once mode) is the partition's end, ends[p], so that
// every record there was applied before the pipeline could apply any, and
// the pipeline's definition recorded for the group is fingerprint (an
// instance with it ran: the next record is applied with it). A partition
// that received no record since the pipeline was added has no origin
// otherwise (an origin is written with the first batch that applies the
// pipeline), and its history could not be backfilled. With record, the
// origins are written, each only while the position is still the end
// (ON CONFLICT DO NOTHING: one a live batch wrote meanwhile is kept), and
// the caller reads them back.
func OriginsAtRest(ctx context.Context, pool *pgxpool.Pool, group, pipeline, topic, fingerprint string, ends map[int32]int64, record bool) ([]BackfillOrigin, error) {
	rows, err := pool.Query(ctx, `
SELECT o.partition, o.next_offset FROM ratchet_offsets o
JOIN ratchet_pipeline_definitions d ON d.consumer_group = o.consumer_group AND d.pipeline = $2 AND d.fingerprint = $4
WHERE o.consumer_group = $1 AND o.topic = $3
  AND NOT EXISTS (SELECT 1 FROM ratchet_pipeline_origins g
                  WHERE g.consumer_group = $1 AND g.pipeline = $2 AND g.partition = o.partition)
ORDER BY o.partition`, group, pipeline, topic, fingerprint)
	if err != nil {
		return nil, fmt.Errorf("read the group's positions for pipeline %s: %w", pipeline, err)
	}
	type pos struct {
		p    int32
		next int64
	}
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pos, error) {
		var x pos
		err := r.Scan(&x.p, &x.next)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the group's positions for pipeline %s: %w", pipeline, err)
	}
	var out []BackfillOrigin
	for _, s := range stored {
		if end, ok := ends[s.p]; !ok || s.next != end {
			continue
		}
		if record {
			if _, err := pool.Exec(ctx, `
INSERT INTO ratchet_pipeline_origins (consumer_group, pipeline, topic, partition, live_from, fingerprint)
SELECT $1, $2, $3, $4, o.next_offset, $6 FROM ratchet_offsets o
WHERE o.consumer_group = $1 AND o.topic = $3 AND o.partition = $4 AND o.next_offset = $5
ON CONFLICT DO NOTHING`, group, pipeline, topic, s.p, s.next, fingerprint); err != nil {
				return nil, fmt.Errorf("record the origin of pipeline %s on %s[%d]: %w", pipeline, topic, s.p, err)
			}
		}
		out = append(out, BackfillOrigin{Topic: topic, Partition: s.p, LiveFrom: s.next, LiveSince: time.Now(), Fingerprint: fingerprint})
	}
	return out, nil
}
