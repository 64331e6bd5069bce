package engine_test

import (
	"context"
	"testing"
	"time"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// TestResetReachesIdleOwner: an offsets reset to earliest while the owner
// runs and no record arrives any more. The owner notices within about a
// second (it polls the rows it owns) and applies everything again, though
// no new record ever reaches it.
func TestResetReachesIdleOwner(t *testing.T) {
	const n = 600
	_, addr := testenv.Kafka(t, 3, topic)
	dbURL := testenv.Postgres(t)
	g := &gen{}
	events := make([]*ratchetv1.Event, n)
	for i := range events {
		events[i] = g.next()
	}
	newProducer(t, addr).send(t, events)

	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	var logs testenv.Buffer
	r := startWith(t, cfg, engine.Options{Owner: "a"}, testenv.Log{To: &logs, JSON: true})
	pool := openPool(t, dbURL)
	applied := func() int64 { return count(t, pool, `SELECT coalesce(sum(count),0) FROM dashboard_rollups`) }
	testenv.Eventually(t, 60*time.Second, func() bool { return applied() == n }, "all %d events applied", n)

	// The partitions are idle now: reset them all to earliest (what
	// `ratchet offsets reset --to-earliest --execute` does).
	rows, err := pool.Query(context.Background(),
		`SELECT topic, partition, epoch, next_offset FROM ratchet_offsets WHERE consumer_group = $1`, cfg.Kafka.GroupID)
	if err != nil {
		t.Fatalf("read offsets: %v", err)
	}
	var moves []store.OffsetMove
	for rows.Next() {
		var m store.OffsetMove
		if err := rows.Scan(&m.Topic, &m.Partition, &m.Epoch, &m.From); err != nil {
			t.Fatalf("scan: %v", err)
		}
		moves = append(moves, m) // To: 0, the log start of kfake
	}
	if rows.Err() != nil || len(moves) != 3 {
		t.Fatalf("offset rows: %d, %v", len(moves), rows.Err())
	}
	res, err := store.ResetOffsets(context.Background(), pool, cfg.Kafka.GroupID, moves)
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	for _, m := range res {
		if !m.Moved {
			t.Fatalf("%s[%d] not moved: %+v", m.Topic, m.Partition, m)
		}
	}
	began := time.Now()
	testenv.Eventually(t, 15*time.Second, func() bool { return applied() == 2*n },
		"every event applied again after the reset (applied %d, want %d)", applied(), 2*n)
	t.Logf("re-applied %d events %s after the reset", n, time.Since(began).Round(10*time.Millisecond))
	testenv.Eventually(t, 10*time.Second, func() bool {
		return count(t, pool, `SELECT sum(next_offset) FROM ratchet_offsets`) == n
	}, "stored offsets back at the end")
	if got := len(logs.Lines("stored offset moved (offsets reset)")); got != 3 {
		t.Errorf("%d log lines for the moved offsets, want one per partition (3)", got)
	}
	r.Stop(t)
	if got := applied(); got != 2*n {
		t.Errorf("applied %d after the stop, want exactly %d: the reset re-applied more than it moved", got, 2*n)
	}
}
