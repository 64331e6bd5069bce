package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/internal/store"
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
	claim, err := store.ClaimPartition(ctx, pool, "g", "events", 0, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
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
	claim, err := store.ClaimPartition(ctx, pool, "g", "clicks", 0, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
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
	claim, err := store.ClaimPartition(ctx, pool, "g", "events", 0, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
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
