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
//   - Process must not end tx: ratchet commits it, with the offset advance
//     in the same COMMIT. tx.Commit and tx.Rollback return ErrTxControl
//     and fail the batch (it is rolled back and tried again, as after any
//     error), even when Process ignores that error; so does a COMMIT or
//     ROLLBACK sent as SQL, found before ratchet sends the advance. Do not
//     defer tx.Rollback either. Nested transactions (tx.Begin, savepoints)
//     are fine: committing one only releases its savepoint.
//   - Process may be called again with the same records after a failure (the
//     transaction was rolled back). It must not keep side effects outside tx.
//   - Returning an error marked with Permanent says the batch can never
//     succeed as it is; ratchet then isolates the records that cause it,
//     splitting the batch in halves until each stands alone. A record the
//     processor refuses before sending anything, whatever the rest of the
//     batch, is cheaper taken out with Reject: the batch goes on without
//     it and its dead letter is the same.
//     Any other error is classified by its cause (PostgreSQL SQLSTATE,
//     connection loss) and retried when transient.
//   - Writes whose results Process does not need, to rows other partitions
//     also update, are best made with ExecLast: they then run with the
//     COMMIT, in the same round trip, and hold those rows' locks shortest.
//   - Process runs on the partition's own goroutine; batches of one partition
//     never overlap, batches of different partitions run concurrently.
//   - Each Record carries the Kafka record's metadata (key, headers,
//     timestamp and its type) besides the decoded event. Its byte slices
//     share memory with the record the consumer returned, nothing is copied
//     on the way: Process may keep them but must never modify them, since a
//     retried batch is given the same records.
//   - What a record's value decodes into depends on its topic's format:
//     Record.Event for protobuf and json (also in the schema registry's wire
//     format), nothing for raw (read Record.Value), Record.Decoded for a
//     custom Decoder (engine.Options.Decoder).
package processor

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// Record is one Kafka record of a batch: its metadata, its raw value and
// what the topic's format decoded the value into.
//
// Key, Value and the headers' values share memory with the record as the
// Kafka client returned it: ratchet copies none of them on the way to the
// processor. A processor may keep them after Process returns (nothing
// reuses them), but must not modify them: a failed batch is retried with
// the same records.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte   // nil when the record has no key
	Value     []byte   // the raw record value, as read from Kafka
	Headers   []Header // in the order the producer wrote them; nil when none
	// Timestamp is the Kafka record timestamp; TimestampType says whose
	// clock it is (the producer's, or the broker's on append). It is the
	// zero time when the record has none.
	Timestamp     time.Time
	TimestampType TimestampType
	// Event is the decoded ratchet.v1.Event for the formats protobuf and
	// json; nil for raw and for a custom Decoder that does not set it.
	Event *ratchetv1.Event
	// Decoded is what a custom Decoder made of the value (its own message
	// type); nil otherwise.
	Decoded any
}

// Header is one Kafka record header. Value shares memory with the record
// (see Record).
type Header struct {
	Key   string
	Value []byte
}

// Header returns the value of the last header called key, and whether
// there is one. Kafka allows a key more than once; the last one wins, as
// in most clients' lookups.
func (r *Record) Header(key string) ([]byte, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return r.Headers[i].Value, true
		}
	}
	return nil, false
}

// TimestampType says what a record's Timestamp means (the topic's
// message.timestamp.type).
type TimestampType int8

// Timestamp types.
const (
	// TimestampNone means the record carries no timestamp.
	TimestampNone TimestampType = iota
	// TimestampCreateTime is the producer's time when it created the record.
	TimestampCreateTime
	// TimestampLogAppendTime is the broker's time when it appended the record.
	TimestampLogAppendTime
)

// String returns "none", "create-time" or "log-append-time".
func (t TimestampType) String() string {
	switch t {
	case TimestampCreateTime:
		return "create-time"
	case TimestampLogAppendTime:
		return "log-append-time"
	default:
		return "none"
	}
}

// Decoder turns a record's value into what a processor applies, in place of
// the format of the topic (engine.Options.Decoder). Decode reads rec (Value,
// Key, Headers, ...) and sets rec.Decoded, and rec.Event if it makes one;
// it must not modify the byte slices. An error means the record can never
// be applied: it goes to the dead-letter topic with the error's text as the
// reason, like a record the built-in formats refuse. Decode is called on
// the partition's goroutine, one record at a time; implementations must be
// safe for concurrent use by several partitions.
type Decoder interface {
	Decode(rec *Record) error
}

// EventReader is implemented by a processor that reads only Record.Event,
// such as the built-in dashboard. ratchet refuses to start it on a topic
// whose format decodes no event (raw) unless a custom Decoder is set.
type EventReader interface {
	ReadsEvents() bool
}

// DecoderFunc adapts a function to a Decoder.
type DecoderFunc func(rec *Record) error

// Decode calls f(rec).
func (f DecoderFunc) Decode(rec *Record) error { return f(rec) }

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

// WrappingDeferrer is a Deferrer that can say whose a deferred statement
// is: wrap is applied to the statement's error when the COMMIT's round
// trip reports it, so the error names what the processor knows (a
// pipeline and its table) although Process has returned.
type WrappingDeferrer interface {
	DeferWrapped(wrap func(error) error, sql string, args ...any)
}

// ExecLastWrapped is ExecLast with wrap applied to the statement's error,
// whether it is reported at once or with the COMMIT.
func ExecLastWrapped(ctx context.Context, tx pgx.Tx, wrap func(error) error, sql string, args ...any) error {
	if d, ok := tx.(WrappingDeferrer); ok {
		d.DeferWrapped(wrap, sql, args...)
		return nil
	}
	if err := ExecLast(ctx, tx, sql, args...); err != nil {
		return wrap(err)
	}
	return nil
}

// Rejecter is implemented by the transaction ratchet passes to Process
// when the batch may go on without a record the processor refuses before
// sending anything to the database (an expression it cannot evaluate, a
// value it cannot convert). Reject(offset, err) takes the record out of
// the batch: Process must then leave out everything the record would
// have written, and err (marked with Permanent) becomes the record's dead
// letter, written with the batch and recorded in its transaction, exactly
// as if the batch had been split until the record stood alone and failed
// with err. Reject returns false when the transaction does not take the
// record (rejecting is off for this attempt): Process must then fail the
// batch with err, as without a Rejecter.
//
// Only a refusal that does not depend on the rest of the batch may be
// rejected: what PostgreSQL refuses, or what depends on the other records
// of the batch (a sum that overflows), fails the batch and is isolated by
// splitting it.
type Rejecter interface {
	Reject(offset int64, err error) bool
}

// Reject asks tx to take the record at offset out of its batch with the
// reason err (see Rejecter). It reports false when tx is not a Rejecter
// or does not take the record; the processor then fails the batch with
// err.
func Reject(tx pgx.Tx, offset int64, err error) bool {
	r, ok := tx.(Rejecter)
	return ok && r.Reject(offset, err)
}

// ErrTxControl is returned by Commit and Rollback of the transaction
// ratchet passes to Process, and fails the batch: the transaction, and the
// offset advance its COMMIT carries, are ratchet's to end.
var ErrTxControl = errors.New("the batch's transaction is committed or rolled back by ratchet, not by the processor")

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
