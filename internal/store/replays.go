package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Replay states in ratchet_replays.
const (
	// ReplayPending: the record is about to be produced, or was produced by
	// a run that stopped before its delivery report was recorded. A later
	// run resolves it: it searches the partition the record was produced
	// to, from SearchFrom up to its end, for the record naming the dead
	// letter (header ratchet.replayed_from); found, the row is done;
	// searched to the end and not found, it was never delivered and is
	// produced again. A search that cannot reach the end (an open
	// transaction hides offsets) leaves the row pending.
	ReplayPending = "pending"
	// ReplayDone: the broker acknowledged the replayed record.
	ReplayDone = "done"
	// ReplayDuplicate: another dead letter of the same source record was
	// replayed instead (the DLQ is at-least-once); never replayed.
	ReplayDuplicate = "duplicate"
)

// Replay is one row of ratchet_replays: a dead letter, by its place in the
// dead-letter topic, and its replay.
type Replay struct {
	DLQTopic     string
	DLQPartition int32
	DLQOffset    int64
	Topic        string // the dead letter's source topic
	Partition    int32  // and partition, where the replay went unless ToTopic differs
	SourceOffset int64  // the dead letter's original offset
	ToTopic      string // the topic the replay was produced to (Topic unless --to-topic)
	ToPartition  int32  // and its partition
	Group        string // the group it is for (ratchet.replay_group); "" unknown
	State        string
	// SearchFrom is the end offset of the partition the record was
	// produced to, before it was produced: the replayed record is at or
	// after it.
	SearchFrom int64
	// ReplayedOffset is where the replayed record landed (-1 until done).
	ReplayedOffset int64
	// Legacy rows were written before duplicates were recorded (migration
	// 005); UpdatedAt is when the row last changed.
	Legacy    bool
	UpdatedAt time.Time
}

// Replays returns the ratchet_replays rows of dlqTopic.
func Replays(ctx context.Context, pool *pgxpool.Pool, dlqTopic string) ([]Replay, error) {
	rows, err := pool.Query(ctx, `
SELECT dlq_topic, dlq_partition, dlq_offset, topic, partition, source_offset, to_topic, to_partition, coalesce(replay_group, ''),
       state, search_from, coalesce(replayed_offset, -1), legacy, updated_at
FROM ratchet_replays WHERE dlq_topic = $1 ORDER BY dlq_partition, dlq_offset`, dlqTopic)
	if err != nil {
		return nil, fmt.Errorf("read replays of %s: %w", dlqTopic, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Replay, error) {
		var x Replay
		err := r.Scan(&x.DLQTopic, &x.DLQPartition, &x.DLQOffset, &x.Topic, &x.Partition, &x.SourceOffset,
			&x.ToTopic, &x.ToPartition, &x.Group, &x.State, &x.SearchFrom, &x.ReplayedOffset, &x.Legacy, &x.UpdatedAt)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("read replays of %s: %w", dlqTopic, err)
	}
	return out, nil
}

// MarkReplaysPending records that rs are about to be produced, and dups
// as duplicates of them. A row that is already done or a duplicate is
// left as it is; a pending one gets the new SearchFrom, target and group.
// All in one transaction: a run killed half-way leaves all or none.
func MarkReplaysPending(ctx context.Context, pool *pgxpool.Pool, rs, dups []Replay) error {
	if len(rs)+len(dups) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range rs {
		b.Queue(`
INSERT INTO ratchet_replays AS r (dlq_topic, dlq_partition, dlq_offset, topic, partition, source_offset, to_topic, to_partition,
                                  replay_group, state, search_from, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), 'pending', $10, now())
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO UPDATE
SET search_from = EXCLUDED.search_from, to_topic = EXCLUDED.to_topic, to_partition = EXCLUDED.to_partition,
    replay_group = EXCLUDED.replay_group, updated_at = now()
WHERE r.state = 'pending'`,
			r.DLQTopic, r.DLQPartition, r.DLQOffset, r.Topic, r.Partition, r.SourceOffset, r.ToTopic, r.ToPartition, r.Group, r.SearchFrom)
	}
	queueDuplicates(b, dups)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
		return fmt.Errorf("record pending replays: %w", err)
	}
	return nil
}

// MarkReplayDuplicates records dups as dead letters whose source record
// was replayed from another dead letter.
func MarkReplayDuplicates(ctx context.Context, pool *pgxpool.Pool, dups []Replay) error {
	if len(dups) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	queueDuplicates(b, dups)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
		return fmt.Errorf("record duplicate dead letters: %w", err)
	}
	return nil
}

func queueDuplicates(b *pgx.Batch, dups []Replay) {
	for _, r := range dups {
		b.Queue(`
INSERT INTO ratchet_replays (dlq_topic, dlq_partition, dlq_offset, topic, partition, source_offset, to_topic, to_partition,
                             replay_group, state, search_from, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), 'duplicate', 0, now())
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO NOTHING`,
			r.DLQTopic, r.DLQPartition, r.DLQOffset, r.Topic, r.Partition, r.SourceOffset, r.ToTopic, r.ToPartition, r.Group)
	}
}

// MarkReplayDone records that the dead letter at (dlqTopic, partition,
// offset) was replayed to replayedOffset of the partition it was produced
// to.
func MarkReplayDone(ctx context.Context, pool *pgxpool.Pool, dlqTopic string, partition int32, offset, replayedOffset int64) error {
	tag, err := pool.Exec(ctx, `
UPDATE ratchet_replays SET state = 'done', replayed_offset = $4, updated_at = now()
WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3 AND state = 'pending'`, dlqTopic, partition, offset, replayedOffset)
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
	Topic string
	// Class, Pipeline and SQLState group the dead letters (empty: none;
	// Class is empty on rows written before it was recorded, grouped by
	// their text instead).
	Class, Pipeline, SQLState string
	// Reason is the error of the group's latest dead letter, without the
	// addresses of its batch and record.
	Reason string
	Count  int64
	Last   time.Time // the latest failed_at
}

// DeadLetterReasons returns group's dead letters grouped by topic, reason
// class, pipeline and SQLSTATE, the most recently failing first, at most
// limit of them. Rows without a class are grouped by their error without
// the addresses the engine and the pipelines put in it ("apply events[3]
// offsets 120..121: ", "record orders[2]@1031: "), which differ for every
// record (redact.Addresses does the same in Go).
func DeadLetterReasons(ctx context.Context, pool *pgxpool.Pool, group string, limit int) ([]DeadLetterReason, error) {
	rows, err := pool.Query(ctx, `
SELECT topic, coalesce(reason, ''), coalesce(pipeline, ''), coalesce(sqlstate, ''),
       (array_agg(text ORDER BY failed_at DESC))[1], count(*), max(failed_at) FROM (
    SELECT topic, reason, pipeline, sqlstate, failed_at,
           regexp_replace(regexp_replace(error, 'apply \S+\[\d+\] offsets \d+\.\.\d+: ', '', 'g'),
                          'record \S+\[\d+\]@\d+: ', '', 'g') AS text
    FROM ratchet_dead_letters WHERE consumer_group = $1
) d
GROUP BY topic, reason, pipeline, sqlstate, CASE WHEN reason IS NULL THEN text END
ORDER BY max(failed_at) DESC, topic, 2, 3, 4 LIMIT $2`, group, limit)
	if err != nil {
		return nil, fmt.Errorf("read dead letters of group %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterReason, error) {
		var d DeadLetterReason
		err := r.Scan(&d.Topic, &d.Class, &d.Pipeline, &d.SQLState, &d.Reason, &d.Count, &d.Last)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read dead letters of group %s: %w", group, err)
	}
	return out, nil
}

// ErrReplayRunning means another `ratchet dlq replay --execute` of the same
// dead-letter topic holds its lease.
var ErrReplayRunning = errors.New("another replay of this dead-letter topic is running")

// ErrReplayLeaseLost is what ReplayLease.Err wraps once the holder must
// stop: its lease was taken by another run, or it could not renew it
// before it would expire.
var ErrReplayLeaseLost = errors.New("replay lease lost")

// ReplayLeaseTTL is how long a replay's lease lasts without renewal: a run
// killed with -9 blocks the next one for at most this long. The holder
// renews it every third of it, and gives it up by its own clock a fifth
// of it before it expires (see ReplayLease).
var ReplayLeaseTTL = 30 * time.Second

// replayLeaseMargin is how much earlier than the database would let
// another run take the lease the holder stops: it covers a produce
// request already on the wire, the scheduling of the goroutine that
// notices, and the drift between the holder's clock and the database's.
func replayLeaseMargin(ttl time.Duration) time.Duration { return ttl / 5 }

// Lease is a held lease of one thing only one run may do at a time: the
// replays of one dead-letter topic (LockReplays), the backfill of one
// pipeline (LockBackfill).
//
// The holder knows until when it may act without asking the database:
// the expiry it last secured, counted by its own monotonic clock from
// when it SENT the claim or renewal that secured it (the database counted
// from a later moment, when it ran the statement), less a margin. When
// that passes without a successful renewal (the database is unreachable,
// or slower than the lease), Lost closes and Err says why, before another
// run can take the lease; a renewal that finds the lease taken closes
// Lost too. Lost never reopens.
type Lease struct {
	pool *pgxpool.Pool
	what string // what the lease is of, for errors: "replays of events.dlq"
	// lostErr is the sentinel Err wraps once the lease is lost.
	lostErr error
	// extendSQL and releaseSQL renew and delete the row; their arguments
	// are key, then the owner (and, to extend, the TTL in milliseconds).
	extendSQL, releaseSQL string
	key                   []any
	owner                 string
	ttl                   time.Duration
	margin                time.Duration
	// extend runs one renewal: held false means the row is no longer this
	// owner's. A field so that tests can fail it.
	extend   func(ctx context.Context) (held bool, err error)
	stop     context.CancelFunc // cancels the renewal goroutine; Release calls it
	renewing chan struct{}      // closed when the renewal goroutine ended
	lost     chan struct{}      // closed with err set when the holder must stop
	once     sync.Once

	mu       sync.Mutex
	deadline time.Time // the holder's own deadline (monotonic); guarded by mu
	err      error     // why lost is closed; guarded by mu
}

// ReplayLease is a held lease of one dead-letter topic's replays (see
// LockReplays).
type ReplayLease = Lease

// leaseTable is the SQL of one kind of lease row. Every statement takes
// the row's key first, then the owner, then (claim, extend) the TTL in
// milliseconds.
type leaseTable struct {
	claim   string // inserts or takes over an expired row; returns owner, expires_at
	holder  string // reads owner and expires_at by key
	extend  string
	release string
	lostErr error // what Err wraps once a lease is lost
	busyErr error // what a claim refused returns
}

var replayLeases = leaseTable{
	claim: `
INSERT INTO ratchet_replay_leases AS l (dlq_topic, owner, expires_at)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (dlq_topic) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
WHERE l.expires_at < now() OR l.owner = EXCLUDED.owner
RETURNING owner, expires_at`,
	holder: `SELECT owner, expires_at FROM ratchet_replay_leases WHERE dlq_topic = $1`,
	extend: `
UPDATE ratchet_replay_leases SET expires_at = now() + $3 * interval '1 millisecond'
WHERE dlq_topic = $1 AND owner = $2`,
	release: `DELETE FROM ratchet_replay_leases WHERE dlq_topic = $1 AND owner = $2`,
	lostErr: ErrReplayLeaseLost,
	busyErr: ErrReplayRunning,
}

// lock takes the lease of key (what names it in errors) for owner, or
// returns t.busyErr at once while another run holds an unexpired one. The
// lease is renewed until Release, or until ctx ends without Release (as a
// killed run stops renewing): then it expires after ttl.
func (t leaseTable) lock(ctx context.Context, pool *pgxpool.Pool, what, owner string, ttl time.Duration, key ...any) (*Lease, error) {
	var holder string
	var until time.Time
	sent := time.Now()
	// A claim answered after the holder's deadline would be a lease
	// already lost: the claim waits no longer than that.
	cctx, cancel := context.WithDeadline(ctx, sent.Add(ttl-replayLeaseMargin(ttl)))
	defer cancel()
	args := append(append([]any{}, key...), owner, ttl.Milliseconds())
	err := pool.QueryRow(cctx, t.claim, args...).Scan(&holder, &until)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := pool.QueryRow(cctx, t.holder, key...).Scan(&holder, &until); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("lock %s: %w", what, err)
		}
		return nil, fmt.Errorf("%s: %w (%s, lease until %s)", what, t.busyErr, holder, until.UTC().Format(time.RFC3339))
	}
	if err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			return nil, fmt.Errorf("lock %s: not answered within %v, before the lease would have to be given up: %w",
				what, ttl-replayLeaseMargin(ttl), err)
		}
		return nil, fmt.Errorf("lock %s: %w", what, err)
	}
	l := newLease(what, owner, ttl, sent, nil)
	l.pool, l.lostErr, l.key = pool, t.lostErr, key
	l.extendSQL, l.releaseSQL = t.extend, t.release
	l.extend = l.extendRow
	rctx, stop := context.WithCancel(ctx)
	l.stop = stop
	go l.renew(rctx) // ends with rctx (Release, or the caller's ctx) or when the lease is lost
	return l, nil
}

// LockReplays takes the lease of dlqTopic's replays for owner, or returns
// ErrReplayRunning at once while another run holds an unexpired one: two
// runs at once would both produce the dead letters neither has recorded
// yet. The lease is renewed until Release, or until ctx ends without
// Release (as a killed run stops renewing): then it expires after
// ReplayLeaseTTL and the next run takes it.
//
// Session-free on purpose: the lease is a row in ratchet_replay_leases,
// taken, renewed and released by single-statement transactions with the
// database's clock, so it works through a transaction-mode pooler
// (PgBouncer, pgcat, RDS Proxy), where consecutive statements may run on
// different server sessions. A session advisory lock (the previous
// design) stayed held on whichever server session took it, and was
// released, if at all, on another one.
func LockReplays(ctx context.Context, pool *pgxpool.Pool, dlqTopic, owner string) (*ReplayLease, error) {
	return replayLeases.lock(ctx, pool, "replays of "+dlqTopic, owner, ReplayLeaseTTL, dlqTopic)
}

// newReplayLease is a lease secured by a request sent at sent; extend
// renews it. The caller starts renew.
func newReplayLease(topic, owner string, ttl time.Duration, sent time.Time,
	extend func(context.Context) (bool, error)) *ReplayLease {
	l := newLease("replays of "+topic, owner, ttl, sent, extend)
	l.lostErr = ErrReplayLeaseLost
	return l
}

// newLease is a lease of what secured by a request sent at sent; extend
// renews it. The caller sets the rest and starts renew.
func newLease(what, owner string, ttl time.Duration, sent time.Time, extend func(context.Context) (bool, error)) *Lease {
	margin := replayLeaseMargin(ttl)
	return &Lease{what: what, owner: owner, ttl: ttl, margin: margin, extend: extend,
		renewing: make(chan struct{}), lost: make(chan struct{}), deadline: sent.Add(ttl - margin)}
}

// extendRow renews the lease row for another ttl by the database's clock.
func (l *Lease) extendRow(ctx context.Context) (bool, error) {
	args := append(append([]any{}, l.key...), l.owner, l.ttl.Milliseconds())
	tag, err := l.pool.Exec(ctx, l.extendSQL, args...)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// renewInterval is how long after a renewal the next one is sent, and
// renewRetry how soon a failed one is tried again: several tries fit
// before the holder's deadline.
func (l *Lease) renewInterval() time.Duration { return l.ttl / 3 }
func (l *Lease) renewRetry() time.Duration    { return l.ttl / 15 }

// renew extends the lease every ttl/3 until ctx ends. Each renewal is
// bounded by the holder's deadline (a renewal answered later could not
// be trusted anyway); a failed one is retried every ttl/15 until the
// deadline passes, and then the lease is lost. A renewal that finds the
// lease taken by another run loses it at once. It closes renewing when it
// returns.
func (l *Lease) renew(ctx context.Context) {
	defer close(l.renewing)
	next := time.Now().Add(l.renewInterval())
	var lastErr error
	for {
		deadline := l.Deadline()
		t := time.NewTimer(time.Until(minTime(next, deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !time.Now().Before(deadline) {
			why := "no renewal was attempted"
			if lastErr != nil {
				why = "last renewal: " + lastErr.Error()
			}
			l.lose(fmt.Errorf("%w: not renewed before it expires (%s): stopped at its holder's deadline, %v before the expiry the database counts",
				l.lostErr, why, l.margin))
			return
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		held, err := l.extend(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return // released meanwhile
		case err == nil && !time.Now().Before(deadline):
			// Answered after the deadline (extend did not heed rctx): the
			// holder has already been past it.
			lastErr = errors.New("renewal answered after the holder's deadline")
		case err != nil:
			lastErr = err
			next = time.Now().Add(l.renewRetry())
		case !held:
			l.lose(fmt.Errorf("%w: taken by another run (this one could not renew it in time)", l.lostErr))
			return
		default:
			lastErr = nil
			l.mu.Lock()
			l.deadline = sent.Add(l.ttl - l.margin)
			l.mu.Unlock()
			next = sent.Add(l.renewInterval())
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (l *Lease) lose(err error) {
	l.mu.Lock()
	l.err = fmt.Errorf("%s: %w", l.what, err)
	l.mu.Unlock()
	close(l.lost)
}

// Lost is closed when the holder must stop producing: the lease was found
// taken by another run, or the holder's deadline passed without a
// successful renewal (before the database would let another run take
// it). Err says which.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lease is held, and once Lost is closed says why
// (it wraps ErrReplayLeaseLost, or ErrBackfillLeaseLost).
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Deadline is the holder's own deadline: the monotonic time until which it
// may act on the lease without a further renewal. A wait that must end
// while the lease is held is bounded by it.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Release stops renewing and gives the lease up (if it is still this
// run's). A failed release leaves the lease to expire.
func (l *Lease) Release(ctx context.Context) error {
	var err error
	l.once.Do(func() {
		l.stop()
		<-l.renewing
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		args := append(append([]any{}, l.key...), l.owner)
		if _, e := l.pool.Exec(ctx, l.releaseSQL, args...); e != nil {
			err = fmt.Errorf("release the lease of %s: %w", l.what, e)
		}
	})
	return err
}
