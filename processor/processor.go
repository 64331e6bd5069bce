// Package processor defines what ratchet applies to PostgreSQL: a Processor
// receives one batch of decoded records of one partition, in offset order,
// together with the open transaction the batch commits in.
//
// The contract is what makes ratchet's guarantees hold for custom code:
//
//   - Process must do all of its writes through tx. ratchet commits tx only
//     after Process returns nil, and in exactly-once mode the same
//     transaction moves the partition's stored offset, so the writes and the
//     offset are applied together or not at all.
//   - Process may be called again with the same records after a failure (the
//     transaction was rolled back). It must not keep side effects outside tx.
//   - Returning an error marked with Permanent says the batch can never
//     succeed as it is; ratchet then isolates the records that cause it.
//     Any other error is classified by its cause (PostgreSQL SQLSTATE,
//     connection loss) and retried when transient.
//   - Writes whose results Process does not need, to rows other partitions
//     also update, are best made with ExecLast: they then run with the
//     COMMIT, in the same round trip, and hold those rows' locks shortest.
//   - Process runs on the partition's own goroutine; batches of one partition
//     never overlap, batches of different partitions run concurrently.
package processor

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// Record is one decoded Kafka record.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte    // the raw record value, as read from Kafka
	Timestamp time.Time // the Kafka record timestamp (producer create time)
	// Headers are the Kafka record's headers in their order; nil when it
	// has none. The dead-letter topic keeps them.
	Headers []Header
	Event   *ratchetv1.Event
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Batch is a contiguous run of one partition's log. Start is the partition's
// stored position before the batch (the first offset not yet applied) and
// Next is the position after it. Records holds the records to apply, in
// offset order; offsets between Start and Next that are not in Records were
// either absent from the log (compaction, transaction markers) or dead
// lettered.
type Batch struct {
	Topic     string
	Partition int32
	Start     int64
	Next      int64
	Records   []Record
}

// Processor applies batches. Implementations must be safe for concurrent use
// by several partitions.
type Processor interface {
	// Name identifies the processor in logs and metrics.
	Name() string
	// Process applies b inside tx. See the package documentation for the
	// contract.
	Process(ctx context.Context, tx pgx.Tx, b Batch) error
}

// Deferrer is implemented by the transaction ratchet passes to Process. A
// statement deferred with it runs in the same transaction after Process
// returns, in the order deferred, sent to the server in one round trip
// together with ratchet's own closing statements (the dead letters, the
// guarded offset advance) and the COMMIT.
//
// It suits a batch's last writes to rows that every partition updates (the
// dashboard's current minute): their row locks are then held for no client
// round trip at all, only while the server runs the statements and
// commits. Process does not see a deferred statement's result; an error it
// raises fails the batch as an error of Process would, classified by its
// SQLSTATE.
type Deferrer interface {
	Defer(sql string, args ...any)
}

// ExecLast runs sql in tx as one of the batch's last writes: deferred to the
// COMMIT's round trip when tx is a Deferrer (as in ratchet), at once
// otherwise (a plain pgx.Tx, in tests or tools).
func ExecLast(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	if d, ok := tx.(Deferrer); ok {
		d.Defer(sql, args...)
		return nil
	}
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

// Func adapts a function to a Processor.
type Func struct {
	ProcessorName string
	Fn            func(ctx context.Context, tx pgx.Tx, b Batch) error
}

// Name returns f.ProcessorName.
func (f Func) Name() string { return f.ProcessorName }

// Process calls f.Fn.
func (f Func) Process(ctx context.Context, tx pgx.Tx, b Batch) error { return f.Fn(ctx, tx, b) }

// permanentError marks an error as one that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as a record error: retrying the same records will not
// help, so ratchet isolates the offending records and dead-letters them.
// Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
