package store_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
	"ratchet/processor/dashboard"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// batch builds a batch of topic "events" partition 0 with one page_view
// event of value 1 per offset in [start, next).
func batch(start, next int64) processor.Batch {
	b := processor.Batch{Topic: "events", Partition: 0, Start: start, Next: next}
	for o := start; o < next; o++ {
		b.Records = append(b.Records, processor.Record{
			Topic: "events", Partition: 0, Offset: o,
			Event: &ratchetv1.Event{Id: fmt.Sprint(o), Metric: "page_view", Value: 1, Time: timestamppb.New(t0)},
		})
	}
	return b
}

// claimFor claims partition 0 of topic for owner "a" in group "g".
func claimFor(tb testing.TB, pool *pgxpool.Pool, topic string) store.Claim {
	tb.Helper()
	c, err := store.ClaimPartition(testCtx(tb), pool, "g", topic, 0, "a", 0)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func rollups(tb testing.TB, pool *pgxpool.Pool) []dashboard.Rollup {
	tb.Helper()
	rs, err := dashboard.Read(testCtx(tb), pool, time.Time{})
	if err != nil {
		tb.Fatal(err)
	}
	return rs
}

func storedNext(tb testing.TB, pool *pgxpool.Pool) int64 {
	tb.Helper()
	offsets, err := store.Offsets(testCtx(tb), pool, "g")
	if err != nil {
		tb.Fatal(err)
	}
	if len(offsets) != 1 {
		tb.Fatalf("offsets = %+v, want one row", offsets)
	}
	return offsets[0].Next
}

func TestApplyExactlyOnce(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	s := store.New(pool, dashboard.New())
	claim := claimFor(t, pool, "events")
	if err := s.Apply(ctx, batch(0, 3), &claim); err != nil {
		t.Fatalf("apply 0..3: %v", err)
	}
	if err := s.Apply(ctx, batch(3, 5), &claim); err != nil {
		t.Fatalf("apply 3..5: %v", err)
	}
	if got := storedNext(t, pool); got != 5 {
		t.Fatalf("next_offset = %d, want 5", got)
	}
	if claim.Next != 0 {
		t.Errorf("Apply changed claim.Next to %d", claim.Next)
	}
	before := rollups(t, pool)
	if len(before) != 1 || before[0].Count != 5 || before[0].Sum != 5 {
		t.Fatalf("rollups = %+v, want one row with count 5", before)
	}

	tests := []struct {
		name         string
		b            processor.Batch
		kind         store.ConflictKind
		sentinel     error
		fenced       bool
		storedNext   int64
		storedEpoch  int64
		claimedEpoch int64
	}{
		{"gap", batch(7, 9), store.Gap, store.ErrOffsetMismatch, false, 5, 1, 1},
		{"overlap", batch(2, 6), store.Overlap, store.ErrOffsetMismatch, false, 5, 1, 1},
		{"replay of the last batch", batch(3, 5), store.Overlap, store.ErrOffsetMismatch, false, 5, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Apply(ctx, tt.b, &claim)
			var conflict *store.OffsetConflictError
			if !errors.As(err, &conflict) {
				t.Fatalf("Apply = %v, want *OffsetConflictError", err)
			}
			if conflict.Kind != tt.kind || conflict.StoredNext != tt.storedNext || conflict.Start != tt.b.Start ||
				conflict.StoredEpoch != tt.storedEpoch || conflict.Epoch != tt.claimedEpoch || conflict.Topic != "events" {
				t.Errorf("conflict = %+v", conflict)
			}
			if !errors.Is(err, tt.sentinel) || store.IsFenced(err) != tt.fenced || !store.IsOffsetConflict(err) {
				t.Errorf("errors.Is(%v, %v) = false or IsFenced != %v", err, tt.sentinel, tt.fenced)
			}
			if got := store.ConflictReason(err); got != tt.kind.String() {
				t.Errorf("ConflictReason = %q, want %q", got, tt.kind)
			}
			if got := rollups(t, pool); !slices.Equal(got, before) {
				t.Errorf("rollups changed by a refused batch: %+v, want %+v", got, before)
			}
			if got := storedNext(t, pool); got != 5 {
				t.Errorf("next_offset = %d, want 5", got)
			}
		})
	}

	t.Run("fenced", func(t *testing.T) {
		newer, err := store.ClaimPartition(ctx, pool, "g", "events", 0, "b", 0)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Apply(ctx, batch(5, 8), &claim)
		var conflict *store.OffsetConflictError
		if !errors.As(err, &conflict) || conflict.Kind != store.Fenced || conflict.StoredEpoch != 2 || conflict.Epoch != 1 {
			t.Fatalf("Apply with the old epoch = %v (%+v), want fenced by epoch 2", err, conflict)
		}
		if !store.IsFenced(err) || !errors.Is(err, store.ErrFenced) || errors.Is(err, store.ErrOffsetMismatch) {
			t.Errorf("%v: want ErrFenced only", err)
		}
		if got := rollups(t, pool); !slices.Equal(got, before) {
			t.Errorf("rollups changed by a fenced batch: %+v", got)
		}
		if err := s.Apply(ctx, batch(5, 8), &newer); err != nil {
			t.Fatalf("apply with the new epoch: %v", err)
		}
		if got := storedNext(t, pool); got != 8 {
			t.Errorf("next_offset = %d, want 8", got)
		}
	})

	t.Run("row deleted", func(t *testing.T) {
		if _, err := pool.Exec(ctx, "DELETE FROM ratchet_offsets"); err != nil {
			t.Fatal(err)
		}
		err := s.Apply(ctx, batch(8, 9), &claim)
		var conflict *store.OffsetConflictError
		if !errors.As(err, &conflict) || conflict.Kind != store.Fenced || conflict.StoredEpoch != 0 {
			t.Fatalf("Apply without a row = %v, want fenced", err)
		}
	})
}

func TestApplyRefusesBadArguments(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	s := store.New(pool, dashboard.New())
	claim := claimFor(t, pool, "clicks")
	tests := []struct {
		name  string
		b     processor.Batch
		claim *store.Claim
	}{
		{"claim of another partition", batch(0, 1), &claim},
		{"next before start", processor.Batch{Topic: "events", Start: 5, Next: 4}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.Apply(ctx, tt.b, tt.claim); err == nil || store.IsOffsetConflict(err) {
				t.Fatalf("Apply = %v, want an argument error", err)
			}
			if got := rollups(t, pool); len(got) != 0 {
				t.Errorf("rollups = %+v, want none", got)
			}
		})
	}
}

func TestApplyAtLeastOnce(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	s := store.New(pool, dashboard.New())
	if err := s.Apply(ctx, batch(10, 14), nil); err != nil {
		t.Fatal(err)
	}
	// At-least-once does not look at the offset store: a replay counts again.
	if err := s.Apply(ctx, batch(10, 14), nil); err != nil {
		t.Fatal(err)
	}
	got := rollups(t, pool)
	if len(got) != 1 || got[0].Count != 8 {
		t.Fatalf("rollups = %+v, want count 8", got)
	}
	if offsets, err := store.Offsets(ctx, pool, "g"); err != nil || len(offsets) != 0 {
		t.Fatalf("offsets = %+v, %v; want none", offsets, err)
	}
}

func TestApplyProcessorError(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	boom := errors.New("boom")
	failing := processor.Func{ProcessorName: "failing", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		if err := dashboard.New().Process(ctx, tx, b); err != nil {
			return err
		}
		return boom
	}}
	s := store.New(pool, failing)
	claim := claimFor(t, pool, "events")
	for _, mode := range []struct {
		name  string
		claim *store.Claim
	}{{"exactly-once", &claim}, {"at-least-once", nil}} {
		t.Run(mode.name, func(t *testing.T) {
			err := s.Apply(ctx, batch(0, 3), mode.claim)
			if !errors.Is(err, boom) {
				t.Fatalf("Apply = %v, want boom", err)
			}
			if store.IsOffsetConflict(err) {
				t.Errorf("%v is classified as an offset conflict", err)
			}
			if got := rollups(t, pool); len(got) != 0 {
				t.Errorf("rollups = %+v, want none after rollback", got)
			}
			if got := storedNext(t, pool); got != 0 {
				t.Errorf("next_offset = %d, want 0", got)
			}
		})
	}
}

// TestApplyLeavesNoTransactionOpen: the exactly-once transaction ends with
// its advance and COMMIT sent together, outside pgx's Tx bookkeeping, so
// every way out (applied, refused, processor error) must leave the
// connection back in the pool with no transaction open, and a single
// connection must serve the next batch.
func TestApplyLeavesNoTransactionOpen(t *testing.T) {
	pool, url := migratedPoolOf1(t)
	ctx := testCtx(t)
	claim := claimFor(t, pool, "events")
	fail := false
	p := processor.Func{ProcessorName: "dashboard-or-fail", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		if err := dashboard.New().Process(ctx, tx, b); err != nil {
			return err
		}
		if fail {
			return errors.New("boom")
		}
		return nil
	}}
	s := store.New(pool, p)
	observer := openPool(t, url, 1)
	openTx := func() int { return openTransactions(t, observer) }
	steps := []struct {
		name    string
		b       processor.Batch
		fail    bool
		wantErr bool
	}{
		{"applied", batch(0, 3), false, false},
		{"refused (gap)", batch(5, 6), false, true},
		{"processor error", batch(3, 4), true, true},
		{"applied after both", batch(3, 5), false, false},
	}
	for _, st := range steps {
		fail = st.fail
		err := s.Apply(ctx, st.b, &claim)
		if (err != nil) != st.wantErr {
			t.Fatalf("%s: Apply = %v", st.name, err)
		}
		if n := openTx(); n != 0 {
			t.Fatalf("%s: %d connections left inside a transaction", st.name, n)
		}
	}
	if got := storedNext(t, pool); got != 5 {
		t.Errorf("next_offset = %d, want 5", got)
	}
	if got := rollups(t, pool); len(got) != 1 || got[0].Count != 5 {
		t.Errorf("rollups = %+v, want count 5", got)
	}
}

// TestApplyRecordsDeadLettersWithTheOffset: dead letters are written in the
// batch's transaction, so a refused batch records none, and a record dead-
// lettered again after a crash is recorded once.
func TestApplyRecordsDeadLettersWithTheOffset(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	s := store.New(pool, dashboard.New())
	claim := claimFor(t, pool, "events")
	dead := func(offsets ...int64) []store.DeadLetter {
		var out []store.DeadLetter
		for _, o := range offsets {
			out = append(out, store.DeadLetter{Offset: o, Error: "decode: bad", Attempts: 1, DLQTopic: "events.dlq", FailedAt: t0})
		}
		return out
	}
	recorded := func() []int64 {
		rows, err := pool.Query(ctx, `SELECT "offset" FROM ratchet_dead_letters ORDER BY "offset"`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	good := batch(0, 4)
	good.Records = slices.Delete(good.Records, 1, 2) // offset 1 was dead-lettered
	if err := s.Apply(ctx, good, &claim, dead(1)...); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("dead letters = %v, want [1]", got)
	}
	// A gap: refused, and its dead letter is not recorded.
	if err := s.Apply(ctx, batch(6, 8), &claim, dead(7)...); !store.IsOffsetConflict(err) {
		t.Fatalf("Apply of a gap = %v, want an offset conflict", err)
	}
	if got := recorded(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("dead letters after a refused batch = %v, want [1]", got)
	}
	// Offset 1 again (dead-lettered twice after a crash) plus a new one.
	next := batch(4, 6)
	next.Records = next.Records[:1]
	if err := s.Apply(ctx, next, &claim, dead(1, 5)...); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Equal(got, []int64{1, 5}) {
		t.Fatalf("dead letters = %v, want [1 5]", got)
	}
	if got := storedNext(t, pool); got != 6 {
		t.Errorf("next_offset = %d, want 6", got)
	}
}

// TestApplyRunsDeferredStatementsWithTheCommit: statements a processor
// defers run after Process, in order, in the batch's transaction (both
// modes); one that fails fails the batch, classified by its SQLSTATE, and
// nothing of the batch is committed.
func TestApplyRunsDeferredStatementsWithTheCommit(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE deferred_test (id int PRIMARY KEY, n int NOT NULL);
		CREATE TABLE deferred_seen (next_offset bigint)`); err != nil {
		t.Fatal(err)
	}
	var deferredSeen bool
	p := processor.Func{ProcessorName: "deferring", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		_, deferredSeen = tx.(processor.Deferrer)
		if err := processor.ExecLast(ctx, tx, `INSERT INTO deferred_test VALUES ($1, 0) ON CONFLICT (id) DO NOTHING`, int(b.Start)); err != nil {
			return err
		}
		// Deferred after the insert: it must see the row.
		if err := processor.ExecLast(ctx, tx, `UPDATE deferred_test SET n = n + $2 WHERE id = $1`, int(b.Start), len(b.Records)); err != nil {
			return err
		}
		// The advance runs before the deferred writes, so the rows other
		// partitions share are locked last: this one sees it done.
		return processor.ExecLast(ctx, tx, `INSERT INTO deferred_seen SELECT max(next_offset) FROM ratchet_offsets`)
	}}
	s := store.New(pool, p)
	n := func(id int) int {
		var v int
		if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT n FROM deferred_test WHERE id = $1), -1)`, id).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	claim := claimFor(t, pool, "events")
	if err := s.Apply(ctx, batch(0, 3), &claim); err != nil {
		t.Fatal(err)
	}
	if !deferredSeen {
		t.Fatal("the transaction passed to Process is not a processor.Deferrer")
	}
	if got := n(0); got != 3 {
		t.Fatalf("exactly-once: n = %d, want 3 (insert, then update, in order)", got)
	}
	var seen int64
	if err := pool.QueryRow(ctx, `SELECT next_offset FROM deferred_seen`).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	if seen != 3 {
		t.Fatalf("a deferred statement saw next_offset %d, want 3: the advance must run before the deferred writes", seen)
	}
	if err := s.Apply(ctx, batch(100, 102), nil); err != nil {
		t.Fatal(err)
	}
	if got := n(100); got != 2 {
		t.Fatalf("at-least-once: n = %d, want 2", got)
	}

	// A deferred statement that breaks a constraint: a record error, and
	// the batch leaves no trace.
	failing := processor.Func{ProcessorName: "failing", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		if err := processor.ExecLast(ctx, tx, `UPDATE deferred_test SET n = 99 WHERE id = 0`); err != nil {
			return err
		}
		return processor.ExecLast(ctx, tx, `INSERT INTO deferred_test VALUES (100, 0)`) // duplicate key
	}}
	fs := store.New(pool, failing)
	for _, c := range []*store.Claim{&claim, nil} {
		err := fs.Apply(ctx, batch(3, 5), c, store.DeadLetter{Offset: 4, Error: "x", Attempts: 1, DLQTopic: "d", FailedAt: t0})
		if !store.IsRecordError(err) || store.IsTransient(err) || store.IsOffsetConflict(err) {
			t.Fatalf("claim %v: Apply = %v, want a record error", c != nil, err)
		}
		if got := n(0); got != 3 {
			t.Errorf("claim %v: n = %d after a failed batch, want 3", c != nil, got)
		}
	}
	if got := storedNext(t, pool); got != 3 {
		t.Errorf("next_offset = %d after a failed batch, want 3", got)
	}
	var dead int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet_dead_letters`).Scan(&dead); err != nil || dead != 0 {
		t.Errorf("dead letters after a failed batch = %d (%v), want 0", dead, err)
	}
}

// TestAsyncCommitOnlyInExactlyOnce: with AsyncCommit, exactly-once
// transactions commit without waiting for the WAL flush; at-least-once
// ones, whose results Kafka's commit would pass, and every transaction of
// a default Store, still wait.
func TestAsyncCommitOnlyInExactlyOnce(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE commit_setting (start bigint PRIMARY KEY, setting text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p := processor.Func{ProcessorName: "setting", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		return processor.ExecLast(ctx, tx, `INSERT INTO commit_setting VALUES ($1, current_setting('synchronous_commit'))`, b.Start)
	}}
	claim := claimFor(t, pool, "events")
	async, sync := store.New(pool, p, store.AsyncCommit()), store.New(pool, p)
	steps := []struct {
		s     *store.Store
		b     processor.Batch
		claim *store.Claim
		want  string
	}{
		{async, batch(0, 2), &claim, "off"},
		{sync, batch(2, 4), &claim, "on"},
		{async, batch(100, 102), nil, "on"},
	}
	for _, st := range steps {
		if err := st.s.Apply(ctx, st.b, st.claim); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := pool.QueryRow(ctx, `SELECT setting FROM commit_setting WHERE start = $1`, st.b.Start).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != st.want {
			t.Errorf("batch at %d (claim %v): synchronous_commit %s, want %s", st.b.Start, st.claim != nil, got, st.want)
		}
	}
	// The setting was local to each transaction.
	var session string
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&session); err != nil || session != "on" {
		t.Errorf("a pooled connection has synchronous_commit %q (%v), want on", session, err)
	}
}

// TestUnansweredPipelinedCommitIsUnknown cuts the connection while the
// batch's deferred write waits for a row lock. Its COMMIT was sent in the
// same round trip, so the server commits it once the lock is released,
// though no answer ever reaches ratchet: whatever step the lost answer
// belonged to, Apply must report the COMMIT's fate as unknown, never as a
// failure to retry as if nothing had been written.
func TestUnansweredPipelinedCommitIsUnknown(t *testing.T) {
	ctx := testCtx(t)
	db := testenv.Postgres(t)
	direct := openPool(t, db, 4)
	if err := store.Migrate(ctx, direct); err != nil {
		t.Fatal(err)
	}
	if err := store.New(direct, dashboard.New()).Apply(ctx, batch(0, 1), nil); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	proxied := openPool(t, u.String(), 1)

	locker, err := direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(context.WithoutCancel(ctx))
	if _, err := locker.Exec(ctx, `SELECT * FROM dashboard_rollups FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- store.New(proxied, dashboard.New()).Apply(ctx, batch(1, 5), nil) }()
	testenv.Eventually(t, 20*time.Second, func() bool {
		var waiting int
		err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting == 1
	}, "the batch's deferred write never waited for the locked row")
	proxy.Cut()
	err = <-done
	if !store.IsCommitUnknown(err) {
		t.Fatalf("Apply after the connection dropped mid-batch = %v, want a COMMIT of unknown fate", err)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The scenario is real: the server ran the COMMIT it had received.
	testenv.Eventually(t, 20*time.Second, func() bool {
		got := rollups(t, direct)
		return len(got) == 1 && got[0].Count == 5
	}, "the server never committed the batch whose answer was lost: %+v", rollups(t, direct))
}

// TestApplyTakesRejectedRecordsOut: a processor that rejects records
// (processor.Reject) has them handed to ApplyOptions.Reject in offset
// order, each reason worded as the batch's error for the record alone; the
// rows Reject returns are recorded with the batch, which commits without
// them. Reject failing commits nothing; without Reject the processor is
// told no and the batch fails.
func TestApplyTakesRejectedRecordsOut(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	var told []bool
	p := processor.Func{ProcessorName: "picky", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		for _, r := range b.Records {
			if r.Offset%3 != 1 {
				continue
			}
			err := processor.Permanent(fmt.Errorf("record @%d: refused", r.Offset))
			ok := processor.Reject(tx, r.Offset, err)
			told = append(told, ok)
			if !ok {
				return err
			}
		}
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}}
	s := store.New(pool, p)
	claim := claimFor(t, pool, "events")
	recorded := func() []int64 {
		rows, err := pool.Query(ctx, `SELECT "offset" FROM ratchet_dead_letters ORDER BY "offset"`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	b := batch(0, 6)
	b.Records = slices.Delete(b.Records, 3, 4) // offset 3 absent: 4 follows 2
	var got []store.Rejected
	reject := func(fail error) func(context.Context, []store.Rejected) ([]store.DeadLetter, error) {
		return func(_ context.Context, rs []store.Rejected) ([]store.DeadLetter, error) {
			got = rs
			var rows []store.DeadLetter
			for _, r := range rs {
				rows = append(rows, store.DeadLetter{Offset: r.Record.Offset, Error: r.Err.Error(), Attempts: 1, DLQTopic: "events.dlq", FailedAt: t0})
			}
			return rows, fail
		}
	}
	if err := s.ApplyWith(ctx, b, &claim, store.ApplyOptions{Reject: reject(errors.New("dlq slow"))}); err == nil {
		t.Fatal("ApplyWith with a failing Reject succeeded")
	}
	if r := recorded(); len(r) != 0 || storedNext(t, pool) != 0 {
		t.Fatalf("after a failing Reject: dead letters %v, next_offset %d; want none, 0", r, storedNext(t, pool))
	}
	if err := s.ApplyWith(ctx, b, &claim, store.ApplyOptions{Reject: reject(nil)}); err != nil {
		t.Fatal(err)
	}
	if r := recorded(); !slices.Equal(r, []int64{1, 4}) || storedNext(t, pool) != 6 {
		t.Fatalf("dead letters %v, next_offset %d; want [1 4], 6", r, storedNext(t, pool))
	}
	want := []string{"apply events[0] offsets 1..2: picky: record @1: refused", "apply events[0] offsets 4..5: picky: record @4: refused"}
	if len(got) != 2 || got[0].Err.Error() != want[0] || got[1].Err.Error() != want[1] || !processor.IsPermanent(got[0].Err) {
		t.Fatalf("rejected %v, want the reasons %q", got, want)
	}
	told = nil
	err := s.ApplyWith(ctx, batch(6, 9), &claim, store.ApplyOptions{})
	if !store.IsRecordError(err) || !slices.Equal(told, []bool{false}) {
		t.Fatalf("without Reject: %v (told %v), want the record error and Reject false", err, told)
	}
	if err.Error() != "apply events[0] offsets 6..9: picky: record @7: refused" {
		t.Errorf("error %q", err)
	}
}
