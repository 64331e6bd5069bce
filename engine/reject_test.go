package engine_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
)

// TestRefusedRecordsTakenOutMatchBisection: the determinism stream, whose
// records ratchet refuses are refused by one pipeline after others took
// them, among records only PostgreSQL refuses, run once with the records
// ratchet refuses taken out of their batches and once with every refusal
// isolated by splitting the batch (the path before): the same tables as
// the model, and the same dead letters (key, value, every header but the
// time, the reason text included), with far fewer batches split.
func TestRefusedRecordsTakenOutMatchBisection(t *testing.T) {
	const partitions = 3
	in := testenv.DeterminismStream(1500, partitions)
	wantDocs, wantGroups, wantNewest, wantDead := testenv.DeterminismModel(in)
	wantLog := testenv.DeterminismLogModel(in)
	path := filepath.Join(t.TempDir(), "pipelines.yaml")
	if err := os.WriteFile(path, []byte(testenv.DeterminismYAML(topic)), 0o600); err != nil {
		t.Fatal(err)
	}
	loaded, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		dead                 map[string]string
		rejected, bisections float64
	}
	run := func(t *testing.T, wait time.Duration) result {
		cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
		db := testenv.Postgres(t)
		pool := openPool(t, db)
		if _, err := pool.Exec(context.Background(), testenv.DeterminismTables); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t, addr, db, config.ModeExactlyOnce)
		cfg.Pipelines = loaded.Pipelines
		cfg.HTTP.Addr = "127.0.0.1:0"
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		testenv.ProduceStream(t, addr, topic, in)
		e := startWith(t, cfg, engine.Options{RejectWait: wait}, testenv.Log{})
		base := "http://" + e.Addr(t, 60*time.Second)
		waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
		docs, groups, newest := testenv.DeterminismResult(t, pool)
		if !slices.Equal(newest, wantNewest) {
			t.Errorf("newest:\n%s", diff(newest, wantNewest))
		}
		if !slices.Equal(docs, wantDocs) {
			t.Errorf("docs:\n%s", diff(docs, wantDocs))
		}
		if !slices.Equal(groups, wantGroups) {
			t.Errorf("per_group:\n%s", diff(groups, wantGroups))
		}
		if log := testenv.DeterminismLogResult(t, pool); !slices.Equal(log, wantLog) {
			t.Errorf("log:\n%s", diff(log, wantLog))
		}
		var recorded int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet_dead_letters`).Scan(&recorded); err != nil {
			t.Fatal(err)
		}
		if recorded != len(wantDead) {
			t.Errorf("ratchet_dead_letters holds %d rows, want %d", recorded, len(wantDead))
		}
		fams := scrape(t, base)
		return result{
			dead:       testenv.DeadLetterRecords(t, addr, topic+".dlq", len(wantDead)),
			rejected:   sum(series(fams, "ratchet_rejected_records_total")),
			bisections: sum(series(fams, "ratchet_bisections_total")),
		}
	}
	var taken, split result
	t.Run("taken out", func(t *testing.T) { taken = run(t, 0) })
	t.Run("split", func(t *testing.T) { split = run(t, -1) })
	t.Logf("taken out: %v rejected, %v bisections; split: %v rejected, %v bisections",
		taken.rejected, taken.bisections, split.rejected, split.bisections)
	ids := slices.Sorted(maps.Keys(split.dead))
	if got := slices.Sorted(maps.Keys(taken.dead)); !slices.Equal(got, ids) || !slices.Equal(ids, wantDead) {
		t.Fatalf("dead letters taken out:\n%s\nsplit vs model:\n%s", diff(got, ids), diff(ids, wantDead))
	}
	for _, id := range ids {
		if taken.dead[id] != split.dead[id] {
			t.Errorf("dead letter %s:\ntaken out %s\nsplit     %s", id, taken.dead[id], split.dead[id])
		}
	}
	ratchetSide := 0
	for _, r := range in {
		switch r.Bad {
		case "upsert.columns.qty", "rollup.time", "upsert.version":
			ratchetSide++
		}
	}
	if taken.rejected < float64(ratchetSide) || split.rejected != 0 {
		t.Errorf("rejected records: %v taken out (want at least the %d ratchet refuses), %v split (want 0)",
			taken.rejected, ratchetSide, split.rejected)
	}
	if taken.bisections >= split.bisections {
		t.Errorf("bisections: %v taken out, not fewer than the %v split", taken.bisections, split.bisections)
	}
}
