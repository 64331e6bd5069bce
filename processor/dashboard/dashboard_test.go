package dashboard_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
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

// Read accepts a pool, a connection and a transaction.
var (
	_ dashboard.Querier = (*pgxpool.Pool)(nil)
	_ dashboard.Querier = (*pgx.Conn)(nil)
	_ dashboard.Querier = pgx.Tx(nil)
)

func ev(metric string, value float64, at time.Time) processor.Record {
	return processor.Record{Event: &ratchetv1.Event{Metric: metric, Value: value, Time: timestamppb.New(at)}}
}

func testCtx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// migratedPool returns a pool on a fresh, migrated database.
func migratedPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := store.Open(testCtx(tb), testenv.Postgres(tb), 8)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := store.Migrate(testCtx(tb), pool); err != nil {
		tb.Fatal(err)
	}
	return pool
}

// process runs the dashboard processor on b in its own transaction.
func process(tb testing.TB, pool *pgxpool.Pool, b processor.Batch) error {
	tb.Helper()
	return pgx.BeginFunc(testCtx(tb), pool, func(tx pgx.Tx) error {
		return dashboard.New().Process(testCtx(tb), tx, b)
	})
}

func read(tb testing.TB, pool *pgxpool.Pool) []dashboard.Rollup {
	tb.Helper()
	rs, err := dashboard.Read(testCtx(tb), pool, time.Time{})
	if err != nil {
		tb.Fatal(err)
	}
	return rs
}

func TestAggregate(t *testing.T) {
	newYork := time.FixedZone("EST", -5*3600)
	tests := []struct {
		name    string
		records []processor.Record
		want    []dashboard.Rollup
	}{
		{"empty", nil, nil},
		{"nil events skipped", []processor.Record{{Offset: 1}, {Offset: 2}}, nil},
		{
			"one bucket",
			[]processor.Record{ev("a", 3, t0), ev("a", -2, t0.Add(59*time.Second)), ev("a", 10, t0.Add(time.Second))},
			[]dashboard.Rollup{{Metric: "a", Bucket: t0, Count: 3, Sum: 11, Min: -2, Max: 10}},
		},
		{
			"metrics and minutes sorted",
			[]processor.Record{
				ev("b", 1, t0.Add(61*time.Second)),
				ev("a", -5, t0.Add(2*time.Minute)),
				ev("b", 4, t0),
				ev("a", -1, t0.Add(-time.Second)),
				ev("b", 2, t0.Add(119*time.Second)),
				{Offset: 9},
				ev("a", -7, t0.Add(2*time.Minute+30*time.Second)),
			},
			[]dashboard.Rollup{
				{Metric: "a", Bucket: t0.Add(-time.Minute), Count: 1, Sum: -1, Min: -1, Max: -1},
				{Metric: "a", Bucket: t0.Add(2 * time.Minute), Count: 2, Sum: -12, Min: -7, Max: -5},
				{Metric: "b", Bucket: t0, Count: 1, Sum: 4, Min: 4, Max: 4},
				{Metric: "b", Bucket: t0.Add(time.Minute), Count: 2, Sum: 3, Min: 1, Max: 2},
			},
		},
		{
			"event time in another zone buckets in UTC",
			[]processor.Record{ev("a", 1, t0.In(newYork).Add(30*time.Second))},
			[]dashboard.Rollup{{Metric: "a", Bucket: t0, Count: 1, Sum: 1, Min: 1, Max: 1}},
		},
		{
			"invalid events left out",
			[]processor.Record{
				ev("a", math.NaN(), t0), ev("a", math.Inf(1), t0), ev("", 1, t0),
				{Event: &ratchetv1.Event{Metric: "a", Value: 1}},
				ev("a", 2, t0),
			},
			[]dashboard.Rollup{{Metric: "a", Bucket: t0, Count: 1, Sum: 2, Min: 2, Max: 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := dashboard.Aggregate(tt.records)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Aggregate = %+v\nwant %+v", got, tt.want)
			}
			for _, r := range got {
				if r.Bucket.Location() != time.UTC {
					t.Errorf("bucket %v is not in UTC", r.Bucket)
				}
			}
		})
	}
}

func TestProcessCombinesBatches(t *testing.T) {
	pool := migratedPool(t)
	first := processor.Batch{Records: []processor.Record{
		ev("a", 5, t0), ev("a", -3, t0.Add(time.Second)), ev("b", 1, t0.Add(time.Minute)),
	}}
	second := processor.Batch{Records: []processor.Record{
		ev("a", 7, t0.Add(10*time.Second)), ev("a", -1, t0), ev("b", 2, t0.Add(time.Minute)), ev("c", 0, t0),
	}}
	for i, b := range []processor.Batch{first, second} {
		if err := process(t, pool, b); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	want := []dashboard.Rollup{
		{Metric: "a", Bucket: t0, Count: 4, Sum: 8, Min: -3, Max: 7},
		{Metric: "c", Bucket: t0, Count: 1, Sum: 0, Min: 0, Max: 0},
		{Metric: "b", Bucket: t0.Add(time.Minute), Count: 2, Sum: 3, Min: 1, Max: 2},
	}
	if got := read(t, pool); !slices.Equal(got, want) {
		t.Errorf("rollups = %+v\nwant %+v", got, want)
	}

	since, err := dashboard.Read(testCtx(t), pool, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(since, want[2:]) {
		t.Errorf("Read since %v = %+v, want %+v", t0.Add(time.Minute), since, want[2:])
	}
}

func TestProcessEmptyBatch(t *testing.T) {
	pool := migratedPool(t)
	tests := []struct {
		name string
		b    processor.Batch
	}{
		{"no records", processor.Batch{Start: 3, Next: 5}},
		{"only nil events", processor.Batch{Records: []processor.Record{{Offset: 3}, {Offset: 4}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := process(t, pool, tt.b); err != nil {
				t.Fatal(err)
			}
			if got := read(t, pool); len(got) != 0 {
				t.Errorf("rollups = %+v, want none", got)
			}
		})
	}
}

func TestProcessRefusesInvalidEvents(t *testing.T) {
	pool := migratedPool(t)
	tests := []struct {
		name string
		r    processor.Record
	}{
		{"nan", ev("a", math.NaN(), t0)},
		{"infinity", ev("a", math.Inf(-1), t0)},
		{"no metric", ev("", 1, t0)},
		{"no time", processor.Record{Event: &ratchetv1.Event{Metric: "a", Value: 1}}},
		{"invalid time", processor.Record{Event: &ratchetv1.Event{Metric: "a", Value: 1, Time: &timestamppb.Timestamp{Nanos: -1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := processor.Batch{Records: []processor.Record{ev("a", 1, t0), tt.r}}
			err := process(t, pool, b)
			if !processor.IsPermanent(err) || !store.IsRecordError(err) {
				t.Fatalf("Process = %v, want a permanent error", err)
			}
			if got := read(t, pool); len(got) != 0 {
				t.Errorf("rollups = %+v, want none", got)
			}
		})
	}
}

// TestConcurrentApply applies batches of four partitions at once, all on the
// same metrics and minutes in shuffled order, in exactly-once mode. Row locks
// taken in different orders would deadlock (40P01); the totals must be exact.
func TestConcurrentApply(t *testing.T) {
	pool := migratedPool(t)
	ctx := testCtx(t)
	s := store.New(pool, dashboard.New())
	const (
		partitions = 4
		batches    = 15
		perBatch   = 40
	)
	metrics := []string{"a", "b", "c", "d", "e"}
	var all []processor.Record
	work := make([][]processor.Batch, partitions)
	for p := range partitions {
		rng := rand.New(rand.NewPCG(uint64(p), 1))
		var offset int64
		for range batches {
			b := processor.Batch{Topic: "events", Partition: int32(p), Start: offset}
			for range perBatch {
				r := ev(metrics[rng.IntN(len(metrics))], float64(rng.IntN(201)-100), t0.Add(time.Duration(rng.IntN(4*60))*time.Second))
				r.Topic, r.Partition, r.Offset = "events", int32(p), offset
				offset++
				b.Records = append(b.Records, r)
			}
			b.Next = offset
			all = append(all, b.Records...)
			work[p] = append(work[p], b)
		}
	}

	errs := make([]error, partitions)
	var wg sync.WaitGroup
	for p := range partitions {
		claim, err := store.ClaimPartition(ctx, pool, "g", "events", int32(p), "a", 0)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for _, b := range work[p] {
				if err := s.Apply(ctx, b, &claim); err != nil {
					errs[p] = fmt.Errorf("partition %d batch %d..%d: %w", p, b.Start, b.Next, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	want := dashboard.Aggregate(all)
	got := read(t, pool)
	slices.SortFunc(got, func(a, b dashboard.Rollup) int {
		return cmp.Or(cmp.Compare(a.Metric, b.Metric), a.Bucket.Compare(b.Bucket))
	})
	if !slices.Equal(got, want) {
		t.Errorf("rollups = %+v\nwant %+v", got, want)
	}
	var count int64
	for _, r := range got {
		count += r.Count
	}
	if count != partitions*batches*perBatch {
		t.Errorf("total count = %d, want %d", count, partitions*batches*perBatch)
	}
}
