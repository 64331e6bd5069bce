package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"ratchet/internal/store"
	"ratchet/internal/testenv"
)

// The live engine's /metrics shows each pipeline backfill's progress as
// the backfill committed it (remaining offsets, records applied, whether a
// run holds the lease), an ascending and a descending range alike; a
// failed read is an error of the scrape and counted, not an empty set.
func TestBackfillProgressIsExported(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := store.StartBackfill(ctx, pool, "g", "per_minute", []store.BackfillPosition{
		{Topic: "orders", Partition: 0, From: 0, To: 100}, {Topic: "orders", Partition: 1, From: 10, To: 50}}); err != nil {
		t.Fatal(err)
	}
	if err := store.StartBackfill(ctx, pool, "g", "latest", []store.BackfillPosition{
		{Topic: "orders", Partition: 0, From: 0, To: 80, Descending: true}}); err != nil {
		t.Fatal(err)
	}
	if err := store.StartBackfill(ctx, pool, "other-group", "x", []store.BackfillPosition{{Topic: "t", From: 0, To: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE ratchet_pipeline_backfills SET next_offset = 40, records = 39 WHERE pipeline = 'per_minute' AND partition = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE ratchet_pipeline_backfills SET next_offset = 30, records = 50 WHERE pipeline = 'latest'`); err != nil {
		t.Fatal(err)
	}
	lease, err := store.LockBackfill(ctx, pool, "g", "per_minute", "run-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(ctx) }()

	c := newBackfillCollector("g")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if n, err := testutil.GatherAndCount(reg, "ratchet_pipeline_backfill_remaining_offsets"); err != nil || n != 0 {
		t.Fatalf("before the engine connected: %d series, %v; want none", n, err)
	}
	c.set(pool)
	const want = `
# HELP ratchet_pipeline_backfill_records Records a pipeline's backfill applied so far, per partition, as committed with them (rate() of it is the backfill's records/s).
# TYPE ratchet_pipeline_backfill_records gauge
ratchet_pipeline_backfill_records{partition="0",pipeline="latest",topic="orders"} 50
ratchet_pipeline_backfill_records{partition="0",pipeline="per_minute",topic="orders"} 39
ratchet_pipeline_backfill_records{partition="1",pipeline="per_minute",topic="orders"} 0
# HELP ratchet_pipeline_backfill_remaining_offsets Offsets of a pipeline's backfill range not applied yet, per partition (0: done).
# TYPE ratchet_pipeline_backfill_remaining_offsets gauge
ratchet_pipeline_backfill_remaining_offsets{partition="0",pipeline="latest",topic="orders"} 30
ratchet_pipeline_backfill_remaining_offsets{partition="0",pipeline="per_minute",topic="orders"} 60
ratchet_pipeline_backfill_remaining_offsets{partition="1",pipeline="per_minute",topic="orders"} 40
# HELP ratchet_pipeline_backfill_running 1 while a run of a pipeline's backfill holds its lease, 0 otherwise.
# TYPE ratchet_pipeline_backfill_running gauge
ratchet_pipeline_backfill_running{pipeline="latest"} 0
ratchet_pipeline_backfill_running{pipeline="per_minute"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratchet_pipeline_backfill_records",
		"ratchet_pipeline_backfill_remaining_offsets", "ratchet_pipeline_backfill_running"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "ratchet_pipeline_backfill_updated_timestamp_seconds"); err != nil || n != 3 {
		t.Fatalf("updated timestamps: %d series, %v; want 3", n, err)
	}

	// The database gone: the scrape says so, and counts it.
	broken, err := pgxpool.New(ctx, "postgres://127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer broken.Close()
	c.set(broken)
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "read backfills of group g") {
		t.Fatalf("a failed read: gather error %v, want the read's", err)
	}
	if got := testutil.ToFloat64(c.errors); got != 1 {
		t.Fatalf("scrape errors %v, want 1", got)
	}
}
