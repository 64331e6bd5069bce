package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Replay states in ratchet_replays.
const (
	// ReplayPending: the record is about to be produced, or was produced by
	// a run that stopped before its delivery report was recorded.
	ReplayPending = "pending"
	// ReplayDone: the broker acknowledged the replayed record.
	ReplayDone = "done"
)

// Replay is one row of ratchet_replays: a dead letter, by its place in the
// dead-letter topic, and its replay into the source topic.
type Replay struct {
	DLQTopic     string
	DLQPartition int32
	DLQOffset    int64
	Topic        string
	Partition    int32
	SourceOffset int64 // the dead letter's original offset
	State        string
	// SearchFrom is the source partition's end offset before the record was
	// produced: a replayed record is at or after it.
	SearchFrom int64
	// ReplayedOffset is where the replayed record landed (-1 until done).
	ReplayedOffset int64
}

// Replays returns the ratchet_replays rows of dlqTopic.
func Replays(ctx context.Context, pool *pgxpool.Pool, dlqTopic string) ([]Replay, error) {
	rows, err := pool.Query(ctx, `
SELECT dlq_topic, dlq_partition, dlq_offset, topic, partition, source_offset, state, search_from, coalesce(replayed_offset, -1)
FROM ratchet_replays WHERE dlq_topic = $1 ORDER BY dlq_partition, dlq_offset`, dlqTopic)
	if err != nil {
		return nil, fmt.Errorf("read replays of %s: %w", dlqTopic, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Replay, error) {
		var x Replay
		err := r.Scan(&x.DLQTopic, &x.DLQPartition, &x.DLQOffset, &x.Topic, &x.Partition, &x.SourceOffset,
			&x.State, &x.SearchFrom, &x.ReplayedOffset)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("read replays of %s: %w", dlqTopic, err)
	}
	return out, nil
}

// MarkReplaysPending records that rs are about to be produced. A row that is
// already done is left as it is; a pending one gets the new SearchFrom.
func MarkReplaysPending(ctx context.Context, pool *pgxpool.Pool, rs []Replay) error {
	if len(rs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range rs {
		b.Queue(`
INSERT INTO ratchet_replays AS r (dlq_topic, dlq_partition, dlq_offset, topic, partition, source_offset, state, search_from, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, now())
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO UPDATE
SET search_from = least(r.search_from, EXCLUDED.search_from), updated_at = now() WHERE r.state = 'pending'`,
			r.DLQTopic, r.DLQPartition, r.DLQOffset, r.Topic, r.Partition, r.SourceOffset, r.SearchFrom)
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record pending replays: %w", err)
	}
	return nil
}

// MarkReplayDone records that the dead letter at (dlqTopic, partition,
// offset) was replayed to replayedOffset of its source partition.
func MarkReplayDone(ctx context.Context, pool *pgxpool.Pool, dlqTopic string, partition int32, offset, replayedOffset int64) error {
	tag, err := pool.Exec(ctx, `
UPDATE ratchet_replays SET state = 'done', replayed_offset = $4, updated_at = now()
WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3`, dlqTopic, partition, offset, replayedOffset)
	if err != nil {
		return fmt.Errorf("record replay of %s/%d/%d: %w", dlqTopic, partition, offset, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("record replay of %s/%d/%d: no pending row", dlqTopic, partition, offset)
	}
	return nil
}

// DeadLetterReason is the dead letters of one input topic with one reason,
// as ratchet_dead_letters records them in exactly-once mode.
type DeadLetterReason struct {
	Topic  string
	Reason string
	Count  int64
	Last   time.Time // the latest failed_at
}

// DeadLetterReasons returns group's dead letters grouped by topic and
// reason, the most recently failing first, at most limit of them. Reasons
// are grouped without the batch offsets the engine prefixes to a database
// error ("apply events[3] offsets 120..121: "), which differ for every
// record.
func DeadLetterReasons(ctx context.Context, pool *pgxpool.Pool, group string, limit int) ([]DeadLetterReason, error) {
	rows, err := pool.Query(ctx, `
SELECT topic, reason, count(*), max(failed_at) FROM (
    SELECT topic, regexp_replace(error, '^apply \S+\[\d+\] offsets \d+\.\.\d+: ', '') AS reason, failed_at
    FROM ratchet_dead_letters WHERE consumer_group = $1
) d
GROUP BY topic, reason ORDER BY max(failed_at) DESC, topic, reason LIMIT $2`, group, limit)
	if err != nil {
		return nil, fmt.Errorf("read dead letters of group %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterReason, error) {
		var d DeadLetterReason
		err := r.Scan(&d.Topic, &d.Reason, &d.Count, &d.Last)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read dead letters of group %s: %w", group, err)
	}
	return out, nil
}

// replayLockClass is the first key of the advisory locks LockReplays takes
// ("rply" in ASCII); the second is the dead-letter topic's hash.
const replayLockClass int32 = 0x72706c79

// ErrReplayRunning means another `ratchet dlq replay --execute` of the same
// dead-letter topic holds its lock.
var ErrReplayRunning = errors.New("another replay of this dead-letter topic is running")

// LockReplays takes the session advisory lock of dlqTopic's replays on a
// connection of its own, or returns ErrReplayRunning at once when another
// run holds it: two runs at once would both produce the dead letters
// neither has recorded yet. unlock releases the lock and the connection;
// a run that dies releases both with its session.
func LockReplays(ctx context.Context, pool *pgxpool.Pool, dlqTopic string) (unlock func(), err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock replays of %s: %w", dlqTopic, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, replayLockClass, dlqTopic).Scan(&ok); err != nil {
		conn.Release()
		return nil, fmt.Errorf("lock replays of %s: %w", dlqTopic, err)
	}
	if !ok {
		conn.Release()
		return nil, fmt.Errorf("%s: %w", dlqTopic, ErrReplayRunning)
	}
	return func() {
		// Unlocked before the connection goes back to the pool; if that
		// fails the connection is closed, which unlocks too.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, replayLockClass, dlqTopic); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		conn.Release()
	}, nil
}
