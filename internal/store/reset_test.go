package store_test

import (
	"errors"
	"testing"
	"time"

	"ratchet/internal/store"
	"ratchet/processor"
	"ratchet/processor/dashboard"
)

// TestResetOffsetsIsGuardedByThePlannedEpoch: a row still under its planned
// epoch is moved, even when its owner applied batches since the plan; a row
// claimed since the plan, or created since, is reported and left alone; a
// partition with no row gets one.
func TestResetOffsetsIsGuardedByThePlannedEpoch(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	claim := func(p int32, owner string, next int64) store.Claim {
		c, err := store.ClaimPartition(ctx, pool, "g", "events", p, owner, next)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c0 := claim(0, "a", 100)
	c1 := claim(1, "a", 200)
	c2 := claim(2, "a", 300)

	plan := []store.OffsetMove{
		{Topic: "events", Partition: 0, Epoch: c0.Epoch, From: 100, To: 0},
		{Topic: "events", Partition: 1, Epoch: c1.Epoch, From: 200, To: 0},
		{Topic: "events", Partition: 2, Epoch: c2.Epoch, From: 300, To: 0,
			Target: func(current int64) int64 { return current - 10 }},
		{Topic: "events", Partition: 3, Epoch: 0, From: -1, To: 40},
		{Topic: "events", Partition: 4, Epoch: 0, From: -1, To: 50},
	}
	// Since the plan: the owner of 0 applied a batch (its own progress),
	// 1 was claimed by b, 2 applied a batch too, and 4 was claimed for
	// the first time.
	s := store.New(pool, dashboard.New())
	for _, c := range []store.Claim{c0, c2} {
		if err := s.Apply(ctx, processor.Batch{Topic: "events", Partition: c.Partition, Start: c.Next, Next: c.Next + 5}, &c); err != nil {
			t.Fatal(err)
		}
	}
	claim(1, "b", 0)
	claim(4, "b", 7)

	res, err := store.ResetOffsets(ctx, pool, "g", plan)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		moved             bool
		to                int64
		foundEpoch, found int64
	}
	wants := []want{
		{true, 0, 1, 105},
		{false, 0, 2, 200},
		{true, 295, 1, 305},
		{true, 40, 1, -1},
		{false, 50, 1, 7},
	}
	for i, w := range wants {
		r := res[i]
		if r.Moved != w.moved || r.To != w.to || r.FoundEpoch != w.foundEpoch || r.FoundNext != w.found {
			t.Errorf("partition %d: got moved %v to %d, found epoch %d at %d; want %+v", r.Partition, r.Moved, r.To, r.FoundEpoch, r.FoundNext, w)
		}
	}
	stored, err := store.Offsets(ctx, pool, "g")
	if err != nil {
		t.Fatal(err)
	}
	wantStored := map[int32][2]int64{0: {1, 0}, 1: {2, 200}, 2: {1, 295}, 3: {1, 40}, 4: {1, 7}}
	for _, s := range stored {
		if w := wantStored[s.Partition]; s.Epoch != w[0] || s.Next != w[1] {
			t.Errorf("row %d: epoch %d next %d, want epoch %d next %d", s.Partition, s.Epoch, s.Next, w[0], w[1])
		}
	}

	// The owner of 0 still holds its claim: its next batch, planned from
	// where it was, is refused (a gap: it starts after the stored
	// position) under its own epoch, the signal that makes a running partition resume from there.
	c0.Next += 5
	err = s.Apply(ctx, processor.Batch{Topic: "events", Partition: 0, Start: c0.Next, Next: c0.Next + 5}, &c0)
	var conflict *store.OffsetConflictError
	if !errors.As(err, &conflict) || conflict.Kind != store.Gap || conflict.StoredEpoch != c0.Epoch || conflict.StoredNext != 0 {
		t.Fatalf("batch after the reset: %v, want a gap to stored next 0 under the same epoch", err)
	}
	// A claim after the reset starts from the reset position.
	if c := claim(3, "c", 999); c.Next != 40 || c.Epoch != 2 {
		t.Errorf("claim after a reset of a new row = %+v, want next 40 epoch 2", c)
	}
}

// TestDeadLetterReasons groups ratchet_dead_letters by topic, reason
// class, pipeline and SQLSTATE, latest first; rows without a class (written
// before it was recorded) by their text without the batch and record
// addresses.
func TestDeadLetterReasons(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for i, d := range []struct {
		topic, err                string
		at                        time.Time
		class, pipeline, sqlstate any
	}{
		{"events", "decode protobuf: bad", t0, nil, nil, nil},
		{"events", "decode protobuf: bad", t0.Add(time.Minute), nil, nil, nil},
		{"events", `apply events[0] offsets 4..5: ledger: ERROR: check "x" (SQLSTATE 23514)`, t0.Add(2 * time.Minute), nil, nil, nil},
		{"events", `apply events[1] offsets 9..10: ledger: ERROR: check "x" (SQLSTATE 23514)`, t0.Add(3 * time.Minute), nil, nil, nil},
		{"other", "decode protobuf: bad", t0, nil, nil, nil},
		{"orders", `apply orders[0] offsets 4..5: pipelines: pipeline o: record orders[0]@4: time: "soon" is not an RFC 3339 time`, t0.Add(4 * time.Minute), "expression", "o", nil},
		{"orders", `apply orders[1] offsets 7..9: pipelines: pipeline o: record orders[1]@8: time: "later" is not an RFC 3339 time`, t0.Add(5 * time.Minute), "expression", "o", nil},
		{"orders", `apply orders[1] offsets 11..12: pipeline o: upsert 1 rows of o: ERROR: invalid input syntax for type numeric: "x" (SQLSTATE 22P02)`, t0.Add(time.Minute), "refused_by_postgres", "o", "22P02"},
	} {
		if _, err := pool.Exec(ctx, `INSERT INTO ratchet_dead_letters VALUES ('g', $1, 0, $2, $3, 1, 'x.dlq', $4, $5, $6, $7)`,
			d.topic, i, d.err, d.at, d.class, d.pipeline, d.sqlstate); err != nil {
			t.Fatal(err)
		}
	}
	got, err := store.DeadLetterReasons(ctx, pool, "g", 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.DeadLetterReason{
		{Topic: "orders", Class: "expression", Pipeline: "o", Reason: `pipelines: pipeline o: time: "later" is not an RFC 3339 time`, Count: 2, Last: t0.Add(5 * time.Minute)},
		{Topic: "events", Reason: `ledger: ERROR: check "x" (SQLSTATE 23514)`, Count: 2, Last: t0.Add(3 * time.Minute)},
		{Topic: "events", Reason: "decode protobuf: bad", Count: 2, Last: t0.Add(time.Minute)},
		{Topic: "orders", Class: "refused_by_postgres", Pipeline: "o", SQLState: "22P02", Reason: `pipeline o: upsert 1 rows of o: ERROR: invalid input syntax for type numeric: "x" (SQLSTATE 22P02)`, Count: 1, Last: t0.Add(time.Minute)},
		{Topic: "other", Reason: "decode protobuf: bad", Count: 1, Last: t0},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		g := got[i]
		same := g.Last.Equal(want[i].Last)
		g.Last = want[i].Last
		if !same || g != want[i] {
			t.Errorf("row %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, _ := store.DeadLetterReasons(ctx, pool, "g", 1); len(got) != 1 {
		t.Errorf("limit 1 returned %d rows", len(got))
	}
}
