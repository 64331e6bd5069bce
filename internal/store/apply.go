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

// Store applies batches through a processor, each in one transaction.
// It is safe for concurrent use by several partitions.
type Store struct {
	pool *pgxpool.Pool
	p    processor.Processor
}

// New returns a Store that applies batches with p on pool.
func New(pool *pgxpool.Pool, p processor.Processor) *Store {
	return &Store{pool: pool, p: p}
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
}

// ApplyWith is Apply with options.
func (s *Store) ApplyWith(ctx context.Context, b processor.Batch, claim *Claim, o ApplyOptions) error {
	if b.Next < b.Start {
		return fmt.Errorf("apply %s[%d]: batch ends at %d before its start %d", b.Topic, b.Partition, b.Next, b.Start)
	}
	if claim != nil && (claim.Topic != b.Topic || claim.Partition != b.Partition) {
		return fmt.Errorf("apply %s[%d]: claim is for %s[%d]", b.Topic, b.Partition, claim.Topic, claim.Partition)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The order keeps row locks short. Dead letters first: their rows
		// are this partition's own, while processors often upsert rows that
		// every partition touches (the dashboard's current minute), whose
		// locks are held until COMMIT.
		if claim != nil {
			if err := recordDeadLetters(ctx, tx, claim, o.Dead); err != nil {
				return err
			}
		}
		if err := s.p.Process(ctx, tx, b); err != nil {
			return fmt.Errorf("%s: %w", s.p.Name(), err)
		}
		// The offset row last: a new owner's claim waits for its lock, so
		// taken at the end, a process frozen mid-batch (GC or VM pause,
		// SIGSTOP) does not hold up the claim that fences it.
		if claim != nil {
			if err := advance(ctx, tx, b, claim); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		var conflict *OffsetConflictError
		if errors.As(err, &conflict) {
			return err
		}
		return fmt.Errorf("apply %s[%d] offsets %d..%d: %w", b.Topic, b.Partition, b.Start, b.Next, err)
	}
	return nil
}

// advance moves the stored position of claim's partition from b.Start to
// b.Next inside tx, or classifies why it may not.
func advance(ctx context.Context, tx pgx.Tx, b processor.Batch, claim *Claim) error {
	tag, err := tx.Exec(ctx, `
UPDATE ratchet_offsets SET next_offset = $5, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND epoch = $4 AND next_offset = $6`,
		claim.Group, claim.Topic, claim.Partition, claim.Epoch, b.Next, b.Start)
	if err != nil {
		return fmt.Errorf("advance offset: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	conflict := &OffsetConflictError{
		Kind: Fenced, Group: claim.Group, Topic: claim.Topic, Partition: claim.Partition,
		Epoch: claim.Epoch, Start: b.Start, StoredNext: -1,
	}
	err = tx.QueryRow(ctx, `
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
		// Same epoch and position, yet the update matched nothing: the row
		// changed between the two statements, so someone else touched it.
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
}

func recordDeadLetters(ctx context.Context, tx pgx.Tx, claim *Claim, dead []DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	offsets := make([]int64, len(dead))
	errs := make([]string, len(dead))
	attempts := make([]int32, len(dead))
	topics := make([]string, len(dead))
	at := make([]time.Time, len(dead))
	for i, d := range dead {
		offsets[i], errs[i], attempts[i], topics[i], at[i] = d.Offset, d.Error, int32(d.Attempts), d.DLQTopic, d.FailedAt
	}
	_, err := tx.Exec(ctx, `
INSERT INTO ratchet_dead_letters (consumer_group, topic, partition, "offset", error, attempts, dlq_topic, failed_at)
SELECT $1, $2, $3, o, e, a, d, f FROM unnest($4::bigint[], $5::text[], $6::int[], $7::text[], $8::timestamptz[]) AS t(o, e, a, d, f)
ON CONFLICT DO NOTHING`, claim.Group, claim.Topic, claim.Partition, offsets, errs, attempts, topics, at)
	if err != nil {
		return fmt.Errorf("record dead letters: %w", err)
	}
	return nil
}
