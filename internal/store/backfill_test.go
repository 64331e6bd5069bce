package store_test

import (
	"errors"
	"testing"

	"ratchet/internal/store"
	"ratchet/processor/dashboard"
)

// A backfill batch commits its rows only with its position: while the run
// holds the lease and the position is where the batch starts. A batch of
// another owner, or one that starts where the position no longer is (a
// rerun after a crash, a second run), is rolled back whole with
// ErrBackfillMoved; an accepted one moves the position and counts its
// records in the same transaction.
func TestBackfillStepGuardsRowsAndPosition(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	s := store.New(pool, dashboard.New())
	pos := store.BackfillPosition{Topic: "events", Partition: 0, From: 0, To: 10, Next: 0}
	if err := store.StartBackfill(ctx, pool, "g", "pl", []store.BackfillPosition{pos}); err != nil {
		t.Fatal(err)
	}
	// A second start keeps the recorded range.
	if err := store.StartBackfill(ctx, pool, "g", "pl", []store.BackfillPosition{{Topic: "events", From: 5, To: 10, Next: 5}}); err != nil {
		t.Fatal(err)
	}
	lease, err := store.LockBackfill(ctx, pool, "g", "pl", "run-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(ctx) }()
	if _, err := store.LockBackfill(ctx, pool, "g", "pl", "run-b"); !errors.Is(err, store.ErrBackfillRunning) {
		t.Fatalf("second lock: %v, want ErrBackfillRunning", err)
	}
	apply := func(owner string, start, next int64) error {
		return s.ApplyWith(ctx, batch(start, next), nil, store.ApplyOptions{Backfill: &store.BackfillStep{
			Group: "g", Pipeline: "pl", Owner: owner, Records: next - start}})
	}
	if err := apply("run-b", 0, 4); !errors.Is(err, store.ErrBackfillMoved) {
		t.Fatalf("a batch of another owner: %v, want ErrBackfillMoved", err)
	}
	if rs := rollups(t, pool); len(rs) != 0 {
		t.Fatalf("a refused batch wrote %+v", rs)
	}
	if err := apply("run-a", 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := apply("run-a", 0, 4); !errors.Is(err, store.ErrBackfillMoved) {
		t.Fatalf("the same batch again: %v, want ErrBackfillMoved", err)
	}
	if err := apply("run-a", 4, 10); err != nil {
		t.Fatal(err)
	}
	rs := rollups(t, pool)
	if len(rs) != 1 || rs[0].Count != 10 {
		t.Fatalf("rollups %+v, want one of count 10", rs)
	}
	got, err := store.Backfills(ctx, pool, "g", "pl")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].From != 0 || got[0].Next != 10 || got[0].Records != 10 || got[0].Remaining() != 0 {
		t.Fatalf("recorded %+v", got)
	}
}

// A descending backfill starts at the end of its range and moves down:
// each step from the batch's Next to its Start, guarded as an ascending
// one is; what remains is below the position.
func TestDescendingBackfillStepMovesDown(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	s := store.New(pool, dashboard.New())
	pos := store.BackfillPosition{Topic: "events", Partition: 0, From: 2, To: 10, Descending: true}
	if err := store.StartBackfill(ctx, pool, "g", "pl", []store.BackfillPosition{pos}); err != nil {
		t.Fatal(err)
	}
	lease, err := store.LockBackfill(ctx, pool, "g", "pl", "run-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(ctx) }()
	recorded := func() store.BackfillPosition {
		t.Helper()
		got, err := store.Backfills(ctx, pool, "g", "pl")
		if err != nil || len(got) != 1 {
			t.Fatalf("recorded %+v, %v", got, err)
		}
		return got[0]
	}
	if r := recorded(); !r.Descending || r.Next != 10 || r.Remaining() != 8 {
		t.Fatalf("a new descending range: %+v, want next 10, 8 remaining", r)
	}
	apply := func(start, next int64) error {
		return s.ApplyWith(ctx, batch(start, next), nil, store.ApplyOptions{Backfill: &store.BackfillStep{
			Group: "g", Pipeline: "pl", Owner: "run-a", Records: next - start, Descending: true}})
	}
	if err := apply(2, 6); !errors.Is(err, store.ErrBackfillMoved) {
		t.Fatalf("a batch below the position's: %v, want ErrBackfillMoved", err)
	}
	if err := apply(6, 10); err != nil {
		t.Fatal(err)
	}
	if err := apply(6, 10); !errors.Is(err, store.ErrBackfillMoved) {
		t.Fatalf("the same batch again: %v, want ErrBackfillMoved", err)
	}
	if r := recorded(); r.Next != 6 || r.Records != 4 || r.Remaining() != 4 {
		t.Fatalf("after one step: %+v, want next 6, 4 records, 4 remaining", r)
	}
	if err := apply(2, 6); err != nil {
		t.Fatal(err)
	}
	if r := recorded(); r.Next != 2 || r.Records != 8 || r.Remaining() != 0 {
		t.Fatalf("done: %+v", r)
	}
	if rs := rollups(t, pool); len(rs) != 1 || rs[0].Count != 8 {
		t.Fatalf("rollups %+v, want one of count 8", rs)
	}
}
