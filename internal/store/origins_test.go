package store_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/store"
)

func def(name, fp string) store.PipelineDefinition {
	return store.PipelineDefinition{Pipeline: name, Topic: "orders", Fingerprint: fp, Definition: []byte(`{"fp":"` + fp + `"}`)}
}

// TestRecordDefinitions: instances starting at once record each new
// pipeline once and agree on adoption (it happens once, for a group with
// positions and nothing recorded); a changed definition records nothing
// and is returned with the recorded one; another group is another record.
func TestRecordDefinitions(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, `INSERT INTO ratchet_offsets (consumer_group, topic, partition, next_offset, epoch, owner)
VALUES ('g', 'orders', 0, 10, 1, 'old'), ('g', 'orders', 1, 20, 1, 'old'), ('g', 'other', 0, 5, 1, 'old')`); err != nil {
		t.Fatal(err)
	}
	defs := []store.PipelineDefinition{def("a", "v1:a"), def("b", "v1:b")}
	var wg sync.WaitGroup
	adopted := make([]int, 4)
	errs := make([]error, 4)
	for i := range adopted {
		wg.Go(func() {
			var changes []store.DefinitionChange
			changes, adopted[i], errs[i] = store.RecordDefinitions(ctx, pool, "g", defs)
			if len(changes) > 0 {
				t.Errorf("changes %v at a first start", changes)
			}
		})
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		total += adopted[i]
	}
	if total != 4 { // two pipelines of orders, two partitions each
		t.Fatalf("%d origins adopted by the instances together, want 4 (%v)", total, adopted)
	}
	var n, adoptedRows int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet_pipeline_definitions WHERE consumer_group = 'g'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d definitions (%v), want 2", n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet_pipeline_origins WHERE adopted AND
((partition = 0 AND live_from = 10) OR (partition = 1 AND live_from = 20))`).Scan(&adoptedRows); err != nil || adoptedRows != 4 {
		t.Fatalf("%d adopted origins at the stored positions (%v), want 4", adoptedRows, err)
	}

	// A pipeline added later is not adopted: its origin is its first batch.
	_, more, err := store.RecordDefinitions(ctx, pool, "g", append(defs, def("c", "v1:c")))
	if err != nil || more != 0 {
		t.Fatalf("adding c: adopted %d, %v; want 0", more, err)
	}

	// A changed definition: nothing recorded (d stays unrecorded too).
	changed := []store.PipelineDefinition{def("a", "v1:a2"), def("b", "v1:b"), def("d", "v1:d")}
	changes, _, err := store.RecordDefinitions(ctx, pool, "g", changed)
	if err != nil || len(changes) != 1 || changes[0].Pipeline != "a" || changes[0].Recorded.Fingerprint != "v1:a" ||
		changes[0].Configured.Fingerprint != "v1:a2" || string(changes[0].Recorded.Definition) != `{"fp": "v1:a"}` {
		t.Fatalf("changes %+v, %v; want a's, v1:a → v1:a2", changes, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet_pipeline_definitions WHERE pipeline = 'd'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("d recorded despite the refusal: %d, %v", n, err)
	}
	same, err := store.CompareDefinitions(ctx, pool, "g", changed)
	if err != nil || len(same) != 1 {
		t.Fatalf("CompareDefinitions: %+v, %v", same, err)
	}
	// Another group has a record of its own.
	if changes, _, err := store.RecordDefinitions(ctx, pool, "h", changed); err != nil || len(changes) != 0 {
		t.Fatalf("group h: %+v, %v", changes, err)
	}

	// Forget with a replacement: a's history goes, its new definition
	// is recorded; then a start with it is no change.
	f, err := store.ForgetPipeline(ctx, pool, "g", "a", &changed[0])
	if err != nil || f.Definitions != 1 || f.Origins != 2 {
		t.Fatalf("forget a: %+v, %v", f, err)
	}
	if changes, _, err := store.RecordDefinitions(ctx, pool, "g", changed); err != nil || len(changes) != 0 {
		t.Fatalf("after the reset: %+v, %v", changes, err)
	}
	// A backfill holding b's lease refuses to forget it.
	if _, err := pool.Exec(ctx, `INSERT INTO ratchet_pipeline_backfill_leases VALUES ('g', 'b', 'someone', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	var running *store.BackfillRunningError
	if _, err := store.ForgetPipeline(ctx, pool, "g", "b", nil); !asRunning(err, &running) || running.Owner != "someone" {
		t.Fatalf("forget b under a backfill lease: %v, want *BackfillRunningError", err)
	}
}

func asRunning(err error, target **store.BackfillRunningError) bool {
	e, ok := err.(*store.BackfillRunningError)
	if ok {
		*target = e
	}
	return ok
}

// TestInsertOrigins: an origin inserted in a transaction that rolls back
// leaves nothing; one committed is kept by later inserts (which report it
// present) whatever their offset.
func TestInsertOrigins(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	insert := func(from int64, commit bool) []string {
		t.Helper()
		var present []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			if present, err = store.InsertOrigins(ctx, tx, "g", "orders", 3, from, []string{"a", "b"}, []string{"v1:a", "v1:b"}); err != nil {
				return err
			}
			if !commit {
				return context.Canceled // rolls back
			}
			return nil
		})
		if commit && err != nil {
			t.Fatal(err)
		}
		return present
	}
	if p := insert(7, false); len(p) != 0 {
		t.Fatalf("present %v on a first insert", p)
	}
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet_pipeline_origins`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d origins after a rollback, want 0", n)
	}
	if p := insert(9, true); len(p) != 0 {
		t.Fatalf("present %v on the first committed insert", p)
	}
	p := insert(50, true)
	slices.Sort(p)
	if !slices.Equal(p, []string{"a", "b"}) {
		t.Fatalf("present %v, want a and b", p)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet_pipeline_origins WHERE live_from = 9 AND partition = 3`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d origins from 9, want 2 (the first committed kept)", n)
	}
}
