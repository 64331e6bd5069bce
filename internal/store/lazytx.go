package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/processor"
)

// lazyTx is the pgx.Tx a processor receives. It takes a connection from
// the pool and begins the transaction when the processor first uses it; a
// processor that only defers its writes (processor.Deferrer) never does,
// and its BEGIN goes to the server with the rest of the transaction, in the
// one round trip that ends it. Every method but Defer begins first, so
// whatever the processor sends is inside the transaction. A connection or
// a BEGIN that fails is not tried again: err keeps the error, every later
// use returns it, and the batch fails with it whatever the processor made
// of it.
//
// The transaction is ratchet's to end: its COMMIT carries the guarded
// offset advance, so a processor that committed it would have its writes
// committed with no advance (and under a fenced claim), and one that rolled
// it back would have the advance commit alone. Commit and Rollback
// therefore only refuse; ended keeps the refusal, and the batch fails with
// it even when the processor ignores the error.
type lazyTx struct {
	ctx      context.Context // for the methods that take none
	pool     *pgxpool.Pool
	conn     *pgxpool.Conn // nil until needed
	tx       pgx.Tx        // nil until begun
	err      error         // the connection's or the BEGIN's error
	ended    error         // the processor tried to commit or roll back
	deferred pgx.Batch
	wraps    map[int]func(error) error // by index in deferred: DeferWrapped's
	// rejecting says the batch may go on without records the processor
	// refuses (ApplyOptions.Reject); rejected holds them, in the order
	// the processor rejected them.
	rejecting bool
	rejected  []rejectMark
}

// rejectMark is a record the processor rejected: its offset and why.
type rejectMark struct {
	offset int64
	err    error
}

// Reject implements processor.Rejecter.
func (t *lazyTx) Reject(offset int64, err error) bool {
	if !t.rejecting || err == nil {
		return false
	}
	t.rejected = append(t.rejected, rejectMark{offset: offset, err: err})
	return true
}

// begun reports whether the transaction was begun on the server.
func (t *lazyTx) begun() bool { return t.tx != nil }

// connect takes the connection from the pool, once.
func (t *lazyTx) connect(ctx context.Context) (*pgxpool.Conn, error) {
	if t.conn == nil && t.err == nil {
		t.conn, t.err = t.pool.Acquire(ctx)
	}
	return t.conn, t.err
}

func (t *lazyTx) begin(ctx context.Context) (pgx.Tx, error) {
	if t.tx == nil && t.err == nil {
		if _, err := t.connect(ctx); err != nil {
			return nil, err
		}
		t.tx, t.err = t.conn.Begin(ctx)
	}
	return t.tx, t.err
}

// release rolls back a transaction still open (whatever failed, or a
// panic) and gives the connection back: the pool closes a connection
// released inside a transaction.
func (t *lazyTx) release() {
	if t.conn == nil {
		return
	}
	if pc := t.conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		_, _ = t.conn.Exec(context.WithoutCancel(t.ctx), "ROLLBACK")
	}
	t.conn.Release()
	t.conn = nil
}

// Defer implements processor.Deferrer.
func (t *lazyTx) Defer(sql string, args ...any) { t.deferred.Queue(sql, args...) }

// DeferWrapped implements processor.WrappingDeferrer.
func (t *lazyTx) DeferWrapped(wrap func(error) error, sql string, args ...any) {
	if t.wraps == nil {
		t.wraps = map[int]func(error) error{}
	}
	t.wraps[t.deferred.Len()] = wrap
	t.deferred.Queue(sql, args...)
}

// wrapPrepare returns err as the DeferWrapped of the deferred statement
// pgx could not prepare asks, when err is that (and err unchanged
// otherwise).
func (t *lazyTx) wrapPrepare(err error) error {
	var pp pgx.ErrPreprocessingBatch
	if err == nil || len(t.wraps) == 0 || !errors.As(err, &pp) {
		return err
	}
	for i, q := range t.deferred.QueuedQueries {
		if w := t.wraps[i]; w != nil && q.SQL == pp.SQL() {
			return w(err)
		}
	}
	return err
}

// wrapDeferred returns the error of deferred statement i as its
// DeferWrapped asked.
func (t *lazyTx) wrapDeferred(i int, err error) error {
	if w := t.wraps[i]; w != nil {
		return w(err)
	}
	return err
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// Commit refuses: see lazyTx. The transaction stays open, and the batch
// fails.
func (t *lazyTx) Commit(context.Context) error { return t.refuse("commit") }

// Rollback refuses: see lazyTx. The transaction stays open, and the batch
// fails (and is rolled back by ratchet).
func (t *lazyTx) Rollback(context.Context) error { return t.refuse("roll back") }

func (t *lazyTx) refuse(op string) error {
	err := fmt.Errorf("%s: %w", op, processor.ErrTxControl)
	if t.ended == nil {
		t.ended = err
	}
	return err
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := t.begin(ctx)
	if err != nil {
		return failedBatch{err: err}
	}
	return tx.SendBatch(ctx, b)
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.begin(t.ctx)
	if err != nil {
		// pgx has no LargeObjects that fails: this one panics when used,
		// and the store reports the panic as the BEGIN's error.
		return pgx.LargeObjects{}
	}
	return tx.LargeObjects()
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return failedRows{err: err}, err
	}
	return tx.Query(ctx, sql, args...)
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := t.begin(ctx)
	if err != nil {
		return failedRows{err: err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

// Conn begins the transaction first: statements sent on the connection are
// then inside it, as they are on any pgx.Tx's connection. Nil when there is
// no connection (its error is the batch's).
func (t *lazyTx) Conn() *pgx.Conn {
	if _, err := t.begin(t.ctx); err != nil && t.conn == nil {
		return nil
	}
	return t.conn.Conn()
}

// failedRows and failedBatch carry the error of a BEGIN that failed to the
// processor's Query, QueryRow and SendBatch, whose results hold their
// errors. They embed the interfaces they implement only so that methods a
// later pgx adds still compile (and panic, reported as the BEGIN's error).
type failedRows struct {
	pgx.Rows
	err error
}

func (r failedRows) Close()                                       {}
func (r failedRows) Err() error                                   { return r.err }
func (r failedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r failedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r failedRows) Next() bool                                   { return false }
func (r failedRows) Scan(...any) error                            { return r.err }
func (r failedRows) Values() ([]any, error)                       { return nil, r.err }
func (r failedRows) RawValues() [][]byte                          { return nil }
func (r failedRows) Conn() *pgx.Conn                              { return nil }
func (r failedRows) TypeMap() *pgtype.Map                         { return nil }

type failedBatch struct {
	pgx.BatchResults
	err error
}

func (b failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b failedBatch) Query() (pgx.Rows, error)         { return failedRows{err: b.err}, b.err }
func (b failedBatch) QueryRow() pgx.Row                { return failedRows{err: b.err} }
func (b failedBatch) Close() error                     { return b.err }
func (b failedBatch) Tx() pgx.Tx                       { return nil }
