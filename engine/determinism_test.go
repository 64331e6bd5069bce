package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
)

// TestPipelineResultsAreAFunctionOfTheInput: one stream through an upsert
// and a rollup of one topic, with values PostgreSQL refuses in superseded
// positions, run by the engine at batch sizes 1, 7 and 500: each run
// leaves the tables and dead-letters the records of the model, computed
// without ratchet.
func TestPipelineResultsAreAFunctionOfTheInput(t *testing.T) {
	const partitions = 3
	in := testenv.DeterminismStream(1500, partitions)
	wantDocs, wantGroups, wantNewest, wantDead := testenv.DeterminismModel(in)
	wantLog := testenv.DeterminismLogModel(in)
	t.Logf("%d docs rows, %d per_group rows, %d dead letters", len(wantDocs), len(wantGroups), len(wantDead))
	path := filepath.Join(t.TempDir(), "pipelines.yaml")
	if err := os.WriteFile(path, []byte(testenv.DeterminismYAML(topic)), 0o600); err != nil {
		t.Fatal(err)
	}
	loaded, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{1, 7, 500} {
		t.Run(fmt.Sprintf("batch size %d", size), func(t *testing.T) {
			cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
			db := testenv.Postgres(t)
			pool := openPool(t, db)
			if _, err := pool.Exec(context.Background(), testenv.DeterminismTables); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, addr, db, config.ModeExactlyOnce)
			cfg.Pipelines = loaded.Pipelines
			cfg.Processing.BatchSize = size
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			testenv.ProduceStream(t, addr, topic, in)
			startWith(t, cfg, engine.Options{}, testenv.Log{})
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
			dead, why := testenv.DeadLetters(t, addr, topic+".dlq", len(wantDead))
			if !slices.Equal(dead, wantDead) {
				t.Errorf("dead letters:\n%s", diff(dead, wantDead))
			}
			bad := map[string]string{}
			offsets := map[int32]int64{}
			for _, r := range in {
				bad[fmt.Sprintf("%d@%d", r.Partition, offsets[r.Partition])] = r.Bad
				offsets[r.Partition]++
			}
			for id, reason := range why {
				if !strings.Contains(reason, bad[id]) {
					t.Errorf("dead letter %s: ratchet.error %q, want it to contain %q", id, reason, bad[id])
				}
			}
		})
	}
}
