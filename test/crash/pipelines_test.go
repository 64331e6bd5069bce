package crash

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/testenv"
)

// crashPipelines are two pipelines of one topic: a rollup (which a replay
// would count twice) and an upsert.
const crashPipelines = `
kafka:
  topics: [events]
pipelines:
  - name: counts
    topic: events
    format: event
    rollup:
      table: metric_counts
      time: value.time
      bucket: 1m
      bucket_column: minute
      group_by: { metric: value.metric }
      aggregates: { n: count, total: sum(value.value) }
  - name: latest
    topic: events
    format: event
    upsert:
      table: events_seen
      key: { id: value.id }
      columns: { metric: value.metric, value: value.value }
`

// TestKillNinePipelinesCountEveryEventOnce: ratchet processes running
// configured pipelines are killed with SIGKILL at random moments while
// events flow; afterwards the rollup counts every event once and the
// upsert table holds one row per event.
func TestKillNinePipelinesCountEveryEventOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("long crash test")
	}
	const events = 60_000
	const kills = 8
	addr := testenv.MockKafka(t, 6, topic, topic+".dlq")
	dbURL := testenv.Postgres(t)
	bin := buildBinary(t)
	cfgPath := filepath.Join(t.TempDir(), "pipelines.yaml")
	if err := os.WriteFile(cfgPath, []byte(crashPipelines), 0o600); err != nil {
		t.Fatal(err)
	}
	pool, _ := counted(t, dbURL)
	if _, err := pool.Exec(context.Background(), `
CREATE TABLE metric_counts (metric text, minute timestamptz, n bigint, total double precision, PRIMARY KEY (metric, minute));
CREATE TABLE events_seen (id text PRIMARY KEY, metric text, value double precision);`); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + dbURL, "RATCHET_COMMIT_MODE=exactly-once",
		"RATCHET_HTTP_ADDR=", "RATCHET_KAFKA_PROPERTIES=session.timeout.ms=6000,heartbeat.interval.ms=500,max.poll.interval.ms=10000",
	}

	opts := produce.Options{Seed: 43, Format: event.FormatProtobuf, TimeSpread: 20 * time.Minute,
		Now: func() time.Time { return time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC) }}
	want := map[key]agg{}
	g := produce.NewGenerator(opts)
	for range events {
		_, _, ev, _ := g.Next()
		k := key{ev.Metric, ev.Time.AsTime().UTC().Truncate(time.Minute)}
		a := want[k]
		a.count++
		a.sum += ev.Value
		want[k] = a
	}
	var produced sync.WaitGroup
	produced.Go(func() { produceAll(t, addr, opts, events) })

	insts := make([]*instance, 2)
	for i := range insts {
		insts[i] = startWithConfig(t, bin, fmt.Sprintf("p%d", i), env, cfgPath)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for k := range kills {
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond) // the random moment of the fault
		i := rng.IntN(len(insts))
		insts[i].kill()
		insts[i] = startWithConfig(t, bin, fmt.Sprintf("p%d-%d", i, k), env, cfgPath)
	}
	produced.Wait()

	total := func() int64 {
		var n int64
		_ = pool.QueryRow(context.Background(), `SELECT coalesce(sum(n),0) FROM metric_counts`).Scan(&n)
		return n
	}
	testenv.Eventually(t, 240*time.Second, func() bool { return total() >= events },
		"all %d events counted (have %d)", events, total())
	for _, in := range insts {
		in.term(t)
	}

	got := map[key]agg{}
	rows, err := pool.Query(context.Background(), `SELECT metric, minute, n, total FROM metric_counts`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k key
		var a agg
		if err := rows.Scan(&k.metric, &k.bucket, &a.count, &a.sum); err != nil {
			t.Fatal(err)
		}
		k.bucket = k.bucket.UTC()
		got[k] = a
	}
	if len(got) != len(want) {
		t.Errorf("rollup rows: got %d, want %d", len(got), len(want))
	}
	for k, w := range want {
		g := got[k]
		if g.count != w.count || math.Abs(g.sum-w.sum) > 1e-6 {
			t.Errorf("%s %s: got count %d sum %v, want count %d sum %v", k.metric, k.bucket.Format(time.RFC3339), g.count, g.sum, w.count, w.sum)
		}
	}
	if n := total(); n != events {
		t.Errorf("counted %d events, produced %d", n, events)
	}
	var seen int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM events_seen`).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	if seen != events {
		t.Errorf("events_seen holds %d rows, produced %d events", seen, events)
	}
	// Each pipeline's origin on each partition committed with its first
	// batch, whatever the kills: every event was applied, so every
	// partition's first batch began at offset 0, with the recorded
	// definition's fingerprint.
	var origins, consistent int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE o.live_from = 0 AND NOT o.adopted AND o.fingerprint = d.fingerprint)
FROM ratchet_pipeline_origins o LEFT JOIN ratchet_pipeline_definitions d USING (consumer_group, pipeline)`).Scan(&origins, &consistent); err != nil {
		t.Fatal(err)
	}
	if origins != 2*6 || consistent != origins {
		t.Errorf("%d origins, %d of them from offset 0 with the recorded fingerprint; want 12 of 12", origins, consistent)
	}
}

// startWithConfig starts `ratchet run --config path` with env.
func startWithConfig(tb testing.TB, bin, name string, env []string, path string) *instance {
	tb.Helper()
	return startInstanceArgs(tb, bin, name, env, "run", "--config", path)
}
