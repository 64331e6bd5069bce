package crash

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"ratchet/internal/testenv"
)

// TestKillNinePipelineResultsAreAFunctionOfTheInput: the determinism
// stream (values PostgreSQL refuses in superseded positions, values
// ratchet refuses) through an upsert and a rollup, the ratchet process
// killed with SIGKILL twice mid-stream and restarted (each life with its
// own batch size): the tables and the dead letters are the model's, as
// in a run without faults.
func TestKillNinePipelineResultsAreAFunctionOfTheInput(t *testing.T) {
	const partitions = 3
	in := testenv.DeterminismStream(1500, partitions)
	wantDocs, wantGroups, wantNewest, wantDead := testenv.DeterminismModel(in)
	wantLog := testenv.DeterminismLogModel(in)
	addr := testenv.MockKafka(t, partitions, topic, topic+".dlq")
	dbURL := testenv.Postgres(t)
	bin := buildBinary(t)
	cfgPath := filepath.Join(t.TempDir(), "pipelines.yaml")
	if err := os.WriteFile(cfgPath, []byte(testenv.DeterminismYAML(topic)), 0o600); err != nil {
		t.Fatal(err)
	}
	pool, _ := counted(t, dbURL)
	if _, err := pool.Exec(context.Background(), testenv.DeterminismTables); err != nil {
		t.Fatal(err)
	}
	testenv.ProduceStream(t, addr, topic, in)
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_COMMIT_MODE=exactly-once",
		"RATCHET_HTTP_ADDR=", "RATCHET_KAFKA_PROPERTIES=session.timeout.ms=6000,heartbeat.interval.ms=500,max.poll.interval.ms=10000",
	}
	applied := func() int64 {
		var n int64
		_ = pool.QueryRow(context.Background(), `SELECT coalesce(sum(next_offset), 0) FROM ratchet_offsets WHERE topic = $1`, topic).Scan(&n)
		return n
	}
	// Each life kills the process once this many records are applied.
	for life, at := range []int64{300, 800} {
		size := []string{"1", "7"}[life]
		proc := startWithConfig(t, bin, fmt.Sprintf("life%d", life), append(env, "RATCHET_PROCESSING_BATCH_SIZE="+size), cfgPath)
		testenv.Eventually(t, 120*time.Second, func() bool { return applied() >= at }, "%d records applied (have %d)", at, applied())
		proc.kill()
		if n := applied(); n >= 1500 {
			t.Fatalf("life %d: every record was applied before the kill (%d): nothing was interrupted", life, n)
		}
	}
	last := startWithConfig(t, bin, "last", append(env, "RATCHET_PROCESSING_BATCH_SIZE=500"), cfgPath)
	testenv.Eventually(t, 120*time.Second, func() bool { return applied() >= 1500 }, "every record applied (have %d)", applied())
	last.term(t)

	docs, groups, newest := testenv.DeterminismResult(t, pool)
	if !slices.Equal(newest, wantNewest) {
		t.Errorf("newest:\ngot  %s\nwant %s", strings.Join(newest, "\n     "), strings.Join(wantNewest, "\n     "))
	}
	if !slices.Equal(docs, wantDocs) {
		t.Errorf("docs:\ngot  %s\nwant %s", strings.Join(docs, "\n     "), strings.Join(wantDocs, "\n     "))
	}
	if !slices.Equal(groups, wantGroups) {
		t.Errorf("per_group:\ngot  %s\nwant %s", strings.Join(groups, "\n     "), strings.Join(wantGroups, "\n     "))
	}
	// The log is appended to exactly once: a kill between a COPY and its
	// batch's commit leaves no row.
	if log := testenv.DeterminismLogResult(t, pool); !slices.Equal(log, wantLog) {
		t.Errorf("log:\ngot  %s\nwant %s", strings.Join(log, "\n     "), strings.Join(wantLog, "\n     "))
	}
	// The dead-letter topic is at-least-once (a kill between a dead
	// letter and its batch's commit writes it again): compare the set.
	dead, _ := testenv.DeadLetters(t, addr, topic+".dlq", len(wantDead))
	uniq := slices.Compact(slices.Clone(dead))
	if n := len(dead) - len(uniq); n > 0 {
		t.Logf("%d dead letters written twice", n)
	}
	dead = uniq
	if !slices.Equal(dead, wantDead) {
		t.Errorf("dead letters:\ngot  %v\nwant %v", dead, wantDead)
	}
}
