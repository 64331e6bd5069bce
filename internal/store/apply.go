package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/processor"
)

// Store applies batches through a processor, each in one transaction.
// It is safe for concurrent use by several partitions.
type Store struct {
	pool        *pgxpool.Pool
	p           processor.Processor
	asyncCommit bool
}

// Option configures a Store.
type Option func(*Store)

// AsyncCommit makes exactly-once transactions commit without waiting for
// their WAL flush (SET LOCAL synchronous_commit = off): rows that every
// partition updates are unlocked before the flush instead of after it. A
// PostgreSQL crash can lose the last transactions so committed; each one
// takes its results and its offset advance with it, so the store still
// says where to resume, and the records are applied again. At-least-once
// transactions always wait: Kafka's commit would pass their lost results.
func AsyncCommit() Option { return func(s *Store) { s.asyncCommit = true } }

// New returns a Store that applies batches with p on pool.
func New(pool *pgxpool.Pool, p processor.Processor, opts ...Option) *Store {
	s := &Store{pool: pool, p: p}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Apply runs the processor on b in one transaction and commits it.
//
// With claim != nil (exactly-once) the same transaction moves the stored
// position from b.Start to b.Next, but only if the row still has claim's
// epoch and next_offset = b.Start. Otherwise nothing is committed and Apply
// returns an *OffsetConflictError (Fenced, Gap or Overlap). With claim == nil
// (at-least-once) the processor's writes are committed alone.
//
// A processor error rolls the transaction back and is returned wrapped, so
// errors.Is and the predicates of this package see it. Apply does not change
// claim; the caller tracks its position.
//
// dead lists records of b's range that were dead-lettered; with a claim they
// are recorded in ratchet_dead_letters in the same transaction (a record
// dead-lettered twice after a crash is recorded once).
func (s *Store) Apply(ctx context.Context, b processor.Batch, claim *Claim, dead ...DeadLetter) error {
	return s.ApplyWith(ctx, b, claim, ApplyOptions{Dead: dead})
}

// ApplyOptions are the optional parts of ApplyWith.
type ApplyOptions struct {
	// Dead lists records of the batch's range that were dead-lettered; with
	// a claim they are recorded in ratchet_dead_letters in the transaction.
	Dead []DeadLetter
	// Reject, when set, lets the processor take records out of the batch
	// that it refuses before sending anything (processor.Rejecter). Once
	// the processor returned, Reject is called with those records, in
	// offset order, each with the error the batch would have failed with
	// had it been split until the record stood alone (its text included):
	// it writes their dead letters and returns, once they are durable, the
	// rows that record them; they join the transaction, which then
	// commits the batch without them. An error of Reject rolls the
	// transaction back and is returned as the batch's. Nil: a record the
	// processor refuses fails the batch.
	Reject func(ctx context.Context, rejected []Rejected) ([]DeadLetter, error)
	// Backfill, with a nil claim, moves a backfill's position from the
	// batch's Start to its Next in the transaction (see BackfillStep); a
	// refused move rolls the batch back with ErrBackfillMoved.
	Backfill *BackfillStep
}

// Rejected is a record the processor took out of its batch.
type Rejected struct {
	Record processor.Record
	// Err is the record's reason, worded as the batch's error would be
	// were the record alone in it (wraps the processor's error).
	Err error
}

// rejectedOf matches what the processor rejected with b's records, in
// offset order, and words each reason as ApplyWith words the error of a
// batch that holds the record alone (as splitting b would leave it).
func rejectedOf(b processor.Batch, name string, marks []rejectMark) ([]Rejected, error) {
	out := make([]Rejected, 0, len(marks))
	last := int64(-1)
	for _, m := range marks {
		i, found := slices.BinarySearchFunc(b.Records, m.offset, func(r processor.Record, o int64) int { return cmp.Compare(r.Offset, o) })
		if !found || m.offset <= last {
			return nil, fmt.Errorf("%s: rejected offset %d is not a record of the batch after %d", name, m.offset, last)
		}
		last = m.offset
		out = append(out, Rejected{Record: b.Records[i],
			Err: fmt.Errorf("apply %s[%d] offsets %d..%d: %s: %w", b.Topic, b.Partition, m.offset, m.offset+1, name, m.err)})
	}
	return out, nil
}

// ApplyWith is Apply with options.
func (s *Store) ApplyWith(ctx context.Context, b processor.Batch, claim *Claim, o ApplyOptions) error {
	if b.Next < b.Start {
		return fmt.Errorf("apply %s[%d]: batch ends at %d before its start %d", b.Topic, b.Partition, b.Next, b.Start)
	}
	if claim != nil && (claim.Topic != b.Topic || claim.Partition != b.Partition) {
		return fmt.Errorf("apply %s[%d]: claim is for %s[%d]", b.Topic, b.Partition, claim.Topic, claim.Partition)
	}
	if claim != nil && o.Backfill != nil {
		return fmt.Errorf("apply %s[%d]: a claim and a backfill step: one position per batch", b.Topic, b.Partition)
	}
	if err := s.apply(ctx, b, claim, o); err != nil {
		var conflict *OffsetConflictError
		if errors.As(err, &conflict) {
			return err
		}
		start, next := b.Start, b.Next
		if len(b.Records) == 1 {
			// A record alone (isolated by splitting) is named by its own
			// offset, not by where its batch was cut (offsets a
			// compaction or dead letters left out around it): its dead
			// letter's text is the same whatever the batch boundaries.
			start = b.Records[0].Offset
			next = start + 1
		}
		return fmt.Errorf("apply %s[%d] offsets %d..%d: %w", b.Topic, b.Partition, start, next, err)
	}
	return nil
}

func (s *Store) process(ctx context.Context, tx *lazyTx, b processor.Batch) (err error) {
	defer func() {
		// After a BEGIN that failed, a panic is that failure's (a
		// LargeObjects used without a transaction); any other panic goes
		// on to the engine, which isolates the record that causes it.
		if tx.err != nil {
			if r := recover(); r != nil {
				err = tx.err
			}
		}
	}()
	err = s.p.Process(ctx, tx, b)
	if tx.ended != nil {
		// Whatever the processor returned: a Commit or Rollback it called
		// was refused, so what it meant to do did not happen.
		return fmt.Errorf("%s: %w", s.p.Name(), tx.ended)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", s.p.Name(), err)
	}
	// The processor may have swallowed the BEGIN's error: its writes did
	// not happen, so the batch fails.
	return tx.err
}

// advanceSQL moves the stored position guarded by epoch and start, and
// fails with SQLSTATE refusedState when no row matches (migration 003).
const (
	advanceSQL   = `SELECT ratchet_advance($1, $2, $3, $4, $5, $6)`
	refusedState = "RT409"
)

// apply runs b's transaction: the processor's immediate writes, then, sent
// to the server together in one round trip, with a claim (exactly-once) the
// dead letters and the guarded advance, the statements the processor
// deferred, and the COMMIT. The transaction begins when the processor
// first sends a statement; a processor that only defers has its BEGIN sent
// in that last round trip too, so the whole batch is one round trip, and a
// batch with nothing to write (at-least-once, nothing written or deferred)
// is none and needs no connection. Processors often write rows that every
// partition touches (the dashboard's current minute), whose locks are held
// until COMMIT; a write deferred to that round trip holds them for no
// client round trip at all, and, queued after this partition's own rows
// (its offset row, its dead letters), for as short a time as the
// transaction allows. A refused advance raises, which aborts the
// transaction before the deferred writes run. The offset row is locked only
// in that last round trip, which the server finishes without waiting on
// the client: a process frozen mid-batch (GC or VM pause, SIGSTOP) does not
// hold up the claim that fences it, since a new owner's claim waits for
// that row's lock.
func (s *Store) apply(ctx context.Context, b processor.Batch, claim *Claim, o ApplyOptions) error {
	tx := &lazyTx{ctx: ctx, pool: s.pool, rejecting: o.Reject != nil}
	bf := o.Backfill
	defer tx.release()
	if err := s.process(ctx, tx, b); err != nil {
		return err
	}
	dead := o.Dead
	if len(tx.rejected) > 0 {
		// Their letters are durable before anything of the batch
		// commits; with a claim, their rows join the transaction.
		rejected, err := rejectedOf(b, s.p.Name(), tx.rejected)
		if err != nil {
			return err
		}
		rows, err := o.Reject(ctx, rejected)
		if err != nil {
			return err
		}
		dead = append(dead[:len(dead):len(dead)], rows...)
	}
	begin := !tx.begun()
	if begin && claim == nil && bf == nil && tx.deferred.Len() == 0 {
		return nil // nothing to write, nothing to advance
	}
	conn, err := tx.connect(ctx)
	if err != nil {
		return err
	}
	if !begin && conn.Conn().PgConn().TxStatus() == 'I' {
		// The processor ended the transaction behind Commit's back (an
		// Exec of COMMIT or ROLLBACK): the advance and the deferred writes
		// would each run and commit on their own. Refuse before sending
		// them.
		return fmt.Errorf("%s: transaction ended by a statement of the processor: %w", s.p.Name(), processor.ErrTxControl)
	}
	// The rows the deferred statements write, which other partitions
	// write too, are locked last, just before COMMIT: the dead letters and
	// the advance touch only this partition's rows, and a refused advance
	// aborts before the processor's deferred writes run at all.
	finish := &pgx.Batch{}
	if begin {
		finish.Queue("BEGIN")
	}
	async := claim != nil && s.asyncCommit
	if async {
		finish.Queue("SET LOCAL synchronous_commit = off")
	}
	if claim != nil {
		queueDeadLetters(finish, claim, dead)
		finish.Queue(advanceSQL, claim.Group, claim.Topic, claim.Partition, claim.Epoch, b.Start, b.Next)
	} else {
		dead = nil
	}
	if bf != nil {
		from, to := bf.positions(b)
		finish.Queue(backfillAdvanceSQL, bf.Group, bf.Pipeline, b.Partition, bf.Owner, from, to, bf.Records)
	}
	deferred := tx.deferred.Len()
	finish.QueuedQueries = append(finish.QueuedQueries, tx.deferred.QueuedQueries...)
	finish.Queue("COMMIT")
	br := conn.SendBatch(ctx, finish)
	// Results come in the order queued; after the first error the server
	// skips the rest, so reading stops there.
	var beginErr, setErr, deadErr, advErr, deferredErr, commitErr error
	next := func(err *error) bool {
		_, *err = br.Exec()
		return *err == nil
	}
	ok := (!begin || next(&beginErr)) && (!async || next(&setErr)) && (len(dead) == 0 || next(&deadErr)) && (claim == nil && bf == nil || next(&advErr))
	// In the describe exec modes pgx prepares every statement of the
	// batch before the first runs: a deferred statement it cannot prepare
	// (a column the table lacks) fails the first step, and only its SQL
	// says which it was.
	for _, e := range []*error{&beginErr, &setErr, &deadErr, &advErr} {
		*e = tx.wrapPrepare(*e)
	}
	for i := 0; ok && i < deferred; i++ {
		if _, err := br.Exec(); err != nil {
			deferredErr = fmt.Errorf("%s: deferred statement %d: %w", s.p.Name(), i+1, tx.wrapDeferred(i, err))
			ok = false
		}
	}
	if ok {
		_, commitErr = br.Exec()
	}
	closeErr := br.Close()
	// The whole batch, COMMIT included, was written in one go: an answer
	// lost to the connection (a cut, a terminated backend, a cancelled
	// context) at any step leaves the COMMIT's fate unknown. The server
	// may still run it, say once a lock it waits for is released, and
	// only the server's own error answer says it rolled back.
	for _, step := range []struct {
		what string
		err  error
	}{{"begin", beginErr}, {"set synchronous_commit", setErr}, {"record dead letters", deadErr},
		{"advance offset", advErr}, {"deferred statements", deferredErr}, {"commit", commitErr}, {"commit", closeErr}} {
		if step.err != nil {
			if commitFateUnknown(step.err) {
				return fmt.Errorf("%s, COMMIT unanswered: %w", step.what, &CommitUnknownError{Err: step.err})
			}
			break
		}
	}
	var pgErr *pgconn.PgError
	switch {
	case beginErr != nil:
		return fmt.Errorf("begin: %w", beginErr)
	case setErr != nil:
		return fmt.Errorf("set synchronous_commit: %w", setErr)
	case deadErr != nil:
		return fmt.Errorf("record dead letters: %w", deadErr)
	case bf != nil && errors.As(advErr, &pgErr) && pgErr.Code == refusedState:
		if _, err := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
			return fmt.Errorf("roll back a refused backfill step: %w", err)
		}
		from, _ := bf.positions(b)
		return fmt.Errorf("backfill of pipeline %s from %d: %w", bf.Pipeline, from, ErrBackfillMoved)
	case errors.As(advErr, &pgErr) && pgErr.Code == refusedState:
		if _, err := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
			return fmt.Errorf("roll back a refused advance: %w", err)
		}
		// Asked on this connection: another one from the pool could be
		// a wait for the last free one.
		return refused(ctx, conn, b, claim)
	case advErr != nil:
		return fmt.Errorf("advance offset: %w", advErr)
	case deferredErr != nil:
		return deferredErr
	case commitErr != nil:
		return fmt.Errorf("commit: %w", &CommitUnknownError{Err: commitErr})
	case closeErr != nil:
		return fmt.Errorf("commit: %w", &CommitUnknownError{Err: closeErr})
	}
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		// COMMIT answered without error yet a transaction is still open:
		// never count that as applied.
		return fmt.Errorf("commit: transaction status %q after COMMIT", st)
	}
	return nil
}

// refused classifies why claim's advance from b.Start was refused, from the
// row as it is now.
func refused(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, b processor.Batch, claim *Claim) error {
	conflict := &OffsetConflictError{
		Kind: Fenced, Group: claim.Group, Topic: claim.Topic, Partition: claim.Partition,
		Epoch: claim.Epoch, Start: b.Start, StoredNext: -1,
	}
	err := q.QueryRow(ctx, `
SELECT epoch, next_offset FROM ratchet_offsets
WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
		claim.Group, claim.Topic, claim.Partition).Scan(&conflict.StoredEpoch, &conflict.StoredNext)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// The row was deleted: no claim holds, so nobody may write.
		return conflict
	case err != nil:
		return fmt.Errorf("read offset after refused advance: %w", err)
	}
	switch {
	case conflict.StoredEpoch != claim.Epoch:
		conflict.Kind = Fenced
	case b.Start > conflict.StoredNext:
		conflict.Kind = Gap
	case b.Start < conflict.StoredNext:
		conflict.Kind = Overlap
	default:
		// Same epoch and position now, yet the update matched nothing when
		// it ran: someone else moved the row in between.
		conflict.Kind = Fenced
	}
	return conflict
}

// DeadLetter is one dead-lettered record, as ratchet_dead_letters keeps it.
type DeadLetter struct {
	Offset   int64
	Error    string
	Attempts int
	DLQTopic string
	FailedAt time.Time
	// Reason, Pipeline and SQLState are the dead letter's reason class,
	// the pipeline that refused it and PostgreSQL's code (empty: none).
	Reason, Pipeline, SQLState string
}

// queueDeadLetters queues the insert of dead into ratchet_dead_letters (a
// record dead-lettered twice after a crash is recorded once); nothing when
// dead is empty.
func queueDeadLetters(batch *pgx.Batch, claim *Claim, dead []DeadLetter) {
	if len(dead) == 0 {
		return
	}
	offsets := make([]int64, len(dead))
	errs := make([]string, len(dead))
	attempts := make([]int32, len(dead))
	topics := make([]string, len(dead))
	at := make([]time.Time, len(dead))
	reasons, pipelines, states := make([]string, len(dead)), make([]string, len(dead)), make([]string, len(dead))
	for i, d := range dead {
		offsets[i], errs[i], attempts[i], topics[i], at[i] = d.Offset, d.Error, int32(d.Attempts), d.DLQTopic, d.FailedAt
		reasons[i], pipelines[i], states[i] = d.Reason, d.Pipeline, d.SQLState
	}
	batch.Queue(`
INSERT INTO ratchet_dead_letters (consumer_group, topic, partition, "offset", error, attempts, dlq_topic, failed_at, reason, pipeline, sqlstate)
SELECT $1, $2, $3, o, e, a, d, f, NULLIF(r, ''), NULLIF(pl, ''), NULLIF(st, '')
FROM unnest($4::bigint[], $5::text[], $6::int[], $7::text[], $8::timestamptz[], $9::text[], $10::text[], $11::text[]) AS t(o, e, a, d, f, r, pl, st)
ON CONFLICT DO NOTHING`, claim.Group, claim.Topic, claim.Partition, offsets, errs, attempts, topics, at, reasons, pipelines, states)
}

// CommitUnknownError is a batch transaction whose COMMIT was sent but not
// answered (the connection dropped, the backend was terminated): the
// server may have committed it. In exactly-once mode the retry finds out
// from the stored offset; in at-least-once mode nothing tells, and applying
// the batch again may count it twice.
type CommitUnknownError struct{ Err error }

func (e *CommitUnknownError) Error() string { return e.Err.Error() }
func (e *CommitUnknownError) Unwrap() error { return e.Err }

// commitFateUnknown reports whether err, met reading the answers to a
// batch whose COMMIT was queued with it, leaves the COMMIT's fate unknown:
// anything but the server's own error answer (after which it aborts the
// transaction and answers the COMMIT with a rollback), unless nothing at
// all reached the server.
func commitFateUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}

// IsCommitUnknown reports whether err is a batch whose COMMIT may or may not
// have taken effect.
func IsCommitUnknown(err error) bool {
	var cu *CommitUnknownError
	return errors.As(err, &cu)
}
