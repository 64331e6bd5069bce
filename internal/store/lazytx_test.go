package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/store"
	"ratchet/processor"
	"ratchet/processor/dashboard"
)

// TestApplyBeginsWhenTheProcessorFirstWrites: a processor that only defers
// its writes (the dashboard) has no transaction open while it runs: its
// BEGIN goes to the server with the advance, its writes and the COMMIT, one
// round trip for the whole batch. A processor that writes at once has its
// transaction begun before its first statement, and that statement is
// inside it.
func TestApplyBeginsWhenTheProcessorFirstWrites(t *testing.T) {
	pool, url := migratedPoolOf1(t)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE lazy_test (offs bigint)`); err != nil {
		t.Fatal(err)
	}
	observer := openPool(t, url, 1)
	openTx := func() int { return openTransactions(t, observer) }
	claim := claimFor(t, pool, "events")

	var during int
	deferring := processor.Func{ProcessorName: "dashboard-observed", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		err := dashboard.New().Process(ctx, tx, b)
		during = openTx()
		return err
	}}
	if err := store.New(pool, deferring).Apply(ctx, batch(0, 3), &claim); err != nil {
		t.Fatal(err)
	}
	if during != 0 {
		t.Errorf("%d transactions open while a deferring processor ran, want 0", during)
	}
	if got := rollups(t, pool); len(got) != 1 || got[0].Count != 3 {
		t.Errorf("rollups = %+v, want count 3", got)
	}
	if got := storedNext(t, pool); got != 3 {
		t.Errorf("next_offset = %d, want 3", got)
	}

	immediate := processor.Func{ProcessorName: "immediate", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		if _, err := tx.Exec(ctx, `INSERT INTO lazy_test VALUES ($1)`, b.Start); err != nil {
			return err
		}
		during = openTx()
		return nil
	}}
	if err := store.New(pool, immediate).Apply(ctx, batch(3, 4), &claim); err != nil {
		t.Fatal(err)
	}
	if during != 1 {
		t.Errorf("%d transactions open after the processor's first statement, want 1 (the statement ran in one of its own)", during)
	}
	if got := storedNext(t, pool); got != 4 {
		t.Errorf("next_offset = %d, want 4", got)
	}
	if n := openTx(); n != 0 {
		t.Errorf("%d connections left inside a transaction", n)
	}
}

// TestApplyWithNothingToWriteNeedsNoDatabase: an at-least-once batch whose
// processor writes and defers nothing has nothing to commit, and does not
// wait on the database; any batch that writes, and every exactly-once batch
// (its offset moves in the database), does.
func TestApplyWithNothingToWriteNeedsNoDatabase(t *testing.T) {
	// Nothing listens on port 1: every connection attempt fails.
	pool, err := pgxpool.New(context.Background(), "postgres://ratchet@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := testCtx(t)
	noop := processor.Func{ProcessorName: "noop", Fn: func(context.Context, pgx.Tx, processor.Batch) error { return nil }}
	if err := store.New(pool, noop).Apply(ctx, batch(0, 3), nil); err != nil {
		t.Errorf("at-least-once, nothing written: Apply = %v, want nil", err)
	}
	writes := processor.Func{ProcessorName: "writes", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	}}
	claim := store.Claim{Group: "g", Topic: "events", Partition: 0, Epoch: 1}
	for _, c := range []struct {
		name  string
		p     processor.Processor
		claim *store.Claim
	}{
		{"at-least-once, deferred writes", dashboard.New(), nil},
		{"at-least-once, immediate writes", writes, nil},
		{"exactly-once, nothing written", noop, &claim},
	} {
		if err := store.New(pool, c.p).Apply(ctx, batch(0, 3), c.claim); err == nil || !store.IsTransient(err) {
			t.Errorf("%s: Apply = %v, want a transient connection error", c.name, err)
		}
	}
}

// TestApplyFailsWhenTheBeginFails: a BEGIN that fails (here: the
// processor's context is cancelled) is not tried again, and the batch fails
// with its error even when the processor ignores it, so the processor's
// later writes never run outside the transaction; a panic it causes (pgx's
// LargeObjects without a transaction) is that same error.
func TestApplyFailsWhenTheBeginFails(t *testing.T) {
	pool, _ := migratedPoolOf1(t)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE begin_test (offs bigint)`); err != nil {
		t.Fatal(err)
	}
	claim := claimFor(t, pool, "events")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, c := range []struct {
		name string
		then func(ctx context.Context, tx pgx.Tx, b processor.Batch) error
	}{
		{"ignored", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			_, _ = tx.Exec(ctx, `INSERT INTO begin_test VALUES ($1)`, b.Start) // error ignored
			return processor.ExecLast(ctx, tx, `INSERT INTO begin_test VALUES ($1)`, b.Start)
		}},
		{"panic", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			lo := tx.LargeObjects()
			_, err := lo.Create(ctx, 0)
			return err
		}},
	} {
		p := processor.Func{ProcessorName: c.name, Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			if _, err := tx.Exec(cancelled, `INSERT INTO begin_test VALUES ($1)`, b.Start); err == nil {
				return errors.New("an Exec on a cancelled context succeeded")
			}
			return c.then(ctx, tx, b)
		}}
		for _, cl := range []*store.Claim{&claim, nil} {
			err := store.New(pool, p).Apply(ctx, batch(0, 3), cl)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s, claim %v: Apply = %v, want the BEGIN's context.Canceled", c.name, cl != nil, err)
			}
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM begin_test`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written (%v), want none", n, err)
	}
	if got := storedNext(t, pool); got != 0 {
		t.Errorf("next_offset = %d, want 0", got)
	}
}

// TestProcessorCannotEndTheTransaction: the batch's transaction is
// ratchet's to end, since its COMMIT carries the guarded offset advance.
// A processor's Commit or Rollback is refused with processor.ErrTxControl
// and fails the batch even when the processor ignores the error; a COMMIT
// sent as SQL is found before the advance and the deferred writes are
// sent, so they never run on their own. Under a fenced claim nothing the
// processor wrote through tx survives.
func TestProcessorCannotEndTheTransaction(t *testing.T) {
	pool, url := migratedPoolOf1(t)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE ctl_test (offs bigint)`); err != nil {
		t.Fatal(err)
	}
	observer := openPool(t, url, 1)
	claim := claimFor(t, pool, "events")
	insert := func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		_, err := tx.Exec(ctx, `INSERT INTO ctl_test VALUES ($1)`, b.Start)
		return err
	}
	for _, c := range []struct {
		name string
		fn   func(ctx context.Context, tx pgx.Tx, b processor.Batch) error
		// committed is what the processor's own SQL COMMIT made durable
		// before ratchet could see it; nothing else may be.
		committed int
	}{
		{"commit", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			if err := insert(ctx, tx, b); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}, 0},
		{"commit, error ignored", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			if err := insert(ctx, tx, b); err != nil {
				return err
			}
			_ = tx.Commit(ctx)
			return processor.ExecLast(ctx, tx, `INSERT INTO ctl_test VALUES ($1)`, b.Next)
		}, 0},
		{"commit before any write", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			_ = tx.Commit(ctx)
			return processor.ExecLast(ctx, tx, `INSERT INTO ctl_test VALUES ($1)`, b.Next)
		}, 0},
		{"rollback, error ignored", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			_ = insert(ctx, tx, b)
			_ = tx.Rollback(ctx)
			return nil
		}, 0},
		{"deferred rollback", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			defer func() { _ = tx.Rollback(ctx) }()
			return insert(ctx, tx, b)
		}, 0},
		{"COMMIT as SQL", func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			if err := insert(ctx, tx, b); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `COMMIT`); err != nil {
				return err
			}
			return processor.ExecLast(ctx, tx, `INSERT INTO ctl_test VALUES ($1)`, b.Next)
		}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `TRUNCATE ctl_test`); err != nil {
				t.Fatal(err)
			}
			p := processor.Func{ProcessorName: "ender", Fn: c.fn}
			for _, cl := range []*store.Claim{&claim, nil} {
				err := store.New(pool, p).Apply(ctx, batch(0, 3), cl)
				if !errors.Is(err, processor.ErrTxControl) {
					t.Errorf("claim %v: Apply = %v, want processor.ErrTxControl", cl != nil, err)
				}
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM ctl_test`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 2*c.committed { // once per Apply
				t.Errorf("%d rows written, want %d", n, 2*c.committed)
			}
			if got := storedNext(t, pool); got != 0 {
				t.Errorf("next_offset = %d, want 0 (the batch failed)", got)
			}
			if n := openTransactions(t, observer); n != 0 {
				t.Errorf("%d connections left inside a transaction", n)
			}
		})
	}

	t.Run("fenced", func(t *testing.T) {
		if _, err := pool.Exec(ctx, `TRUNCATE ctl_test`); err != nil {
			t.Fatal(err)
		}
		if _, err := store.ClaimPartition(ctx, pool, "g", "events", 0, "b", 0); err != nil {
			t.Fatal(err)
		}
		p := processor.Func{ProcessorName: "committer", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
			if err := insert(ctx, tx, b); err != nil {
				return err
			}
			_ = tx.Commit(ctx)
			return nil
		}}
		if err := store.New(pool, p).Apply(ctx, batch(0, 3), &claim); err == nil {
			t.Error("Apply under a fenced claim succeeded")
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ctl_test`).Scan(&n); err != nil || n != 0 {
			t.Errorf("%d rows written under a fenced claim (%v), want none", n, err)
		}
	})
}
