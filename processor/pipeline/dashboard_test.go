package pipeline_test

import (
	"context"
	"math"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/config"
	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	"ratchet/processor"
	"ratchet/processor/dashboard"
	"ratchet/processor/pipeline"
)

// migratedPool returns a pool on a fresh database with ratchet's schema
// (dashboard_rollups included).
func migratedPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Postgres(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := store.Migrate(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	return pool
}

// TestDashboardExampleAgreesWithTheBuiltIn: examples/pipelines/dashboard.yaml
// and the built-in dashboard processor, given the same batches of events,
// leave dashboard_rollups equal row for row (count, sum, min and max
// exactly).
func TestDashboardExampleAgreesWithTheBuiltIn(t *testing.T) {
	raw, err := os.ReadFile("../../examples/pipelines/dashboard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(t, string(raw))
	if err != nil {
		t.Fatal(err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	builtIn, piped := migratedPool(t), migratedPool(t)
	schema, err := pipeline.Check(ctx, piped, set)
	if err != nil {
		t.Fatal(err)
	}
	pp := pipeline.New(set, schema, nil)

	// Events with non-integer values too (the generator's are multiples of
	// 0.25; these add thirds), so that an order of addition that differs
	// would show.
	g := produce.NewGenerator(produce.Options{Seed: 25, Format: event.FormatProtobuf, TimeSpread: 2 * time.Hour,
		Now: func() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) }})
	dec := event.NewDecoder(event.FormatProtobuf)
	var recs []processor.Record
	for i := range 3000 {
		k, v, _, _ := g.Next()
		r := processor.Record{Topic: "events", Offset: int64(i), Key: k, Value: v}
		if err := dec.DecodeRecord(&r); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			r.Event.Value += 1.0 / 3
		}
		recs = append(recs, r)
	}
	for start, size := 0, 1; start < len(recs); start, size = start+size, size%97+13 {
		end := min(start+size, len(recs))
		b := processor.Batch{Topic: "events", Start: int64(start), Next: int64(end), Records: recs[start:end]}
		for _, run := range []struct {
			pool *pgxpool.Pool
			p    processor.Processor
		}{{builtIn, dashboard.New()}, {piped, pp}} {
			if err := pgx.BeginFunc(ctx, run.pool, func(tx pgx.Tx) error { return run.p.Process(ctx, tx, b) }); err != nil {
				t.Fatalf("%s, batch at %d: %v", run.p.Name(), start, err)
			}
		}
	}
	want, err := dashboard.Read(ctx, builtIn, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := dashboard.Read(ctx, piped, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 100 {
		t.Fatalf("only %d rollup rows: the input is too small to compare", len(want))
	}
	if len(got) != len(want) {
		t.Fatalf("pipeline wrote %d rows, the dashboard %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if w.Metric != g.Metric || !w.Bucket.Equal(g.Bucket) || w.Count != g.Count ||
			math.Float64bits(w.Sum) != math.Float64bits(g.Sum) || w.Min != g.Min || w.Max != g.Max {
			t.Fatalf("row %d: dashboard %+v, pipeline %+v", i, w, g)
		}
	}
}

// The example usable with `ratchet dev` passes the configuration checks
// the engine makes.
func TestExamplesLoad(t *testing.T) {
	for _, path := range []string{"../../examples/pipelines/dashboard.yaml", "../../examples/pipelines/orders.yaml"} {
		cfg, err := config.Load(path, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if _, err := pipeline.Compile(cfg); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
}
