package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// TestRefusedClaimsAreRetried: PostgreSQL refuses every claim for 13 s when
// the partitions are assigned (a trigger on ratchet_offsets raises while a
// flag row exists). The partitions stay with this member, paused, and
// /readyz says degraded with the reason; once claims succeed again every
// partition is consumed from its stored position and every event is applied
// exactly once. Before, a failed claim left its partition unconsumed for
// good while the instance reported ready. The held partitions are the
// member's: the warning that the group has more members than partitions
// (after 10 s without any) must not fire for the only member; before, it
// did.
func TestRefusedClaimsAreRetried(t *testing.T) {
	const n = 4000
	_, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	ctx := context.Background()
	if err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE test_refuse_claims (on_ bool)`,
		`INSERT INTO test_refuse_claims VALUES (true)`,
		`CREATE FUNCTION test_refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   IF EXISTS (SELECT 1 FROM test_refuse_claims) THEN
		     RAISE EXCEPTION 'claims refused by the test';
		   END IF;
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON ratchet_offsets
		 FOR EACH ROW EXECUTE FUNCTION test_refuse_claims()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	g := &gen{}
	pr := newProducer(t, addr)
	batch := make([]*ratchetv1.Event, n)
	for i := range batch {
		batch[i] = g.next()
	}
	pr.send(t, batch)

	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Retry.MaxBackoff = time.Second
	cfg.HTTP.Addr = "127.0.0.1:0"
	logs := &testenv.Buffer{}
	r := startWith(t, cfg, engine.Options{Processor: ledger{"a"}, Owner: "a"}, testenv.Log{To: logs, JSON: true})
	base := "http://" + r.Addr(t, 60*time.Second)
	rd := pollReadiness(t, base)
	rd.waitFor(t, "degraded", 60*time.Second)
	refusedAt := time.Now()
	if got := count(t, pool, `SELECT count(*) FROM test_ledger`); got != 0 {
		t.Fatalf("%d events applied without a claim", got)
	}
	// Refusing is the scenario; it lasts 13 s, past the 10 s after which
	// a member without partitions warns.
	time.Sleep(13*time.Second - time.Since(refusedAt))
	if got := count(t, pool, `SELECT count(*) FROM test_ledger`); got != 0 {
		t.Fatalf("%d events applied without a claim", got)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM test_refuse_claims`); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, pool, n)
	rd.waitFor(t, "ready", 30*time.Second)
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, n)
	if got := count(t, pool, `SELECT count(*) FROM ratchet_offsets WHERE epoch >= 1`); got != 4 {
		t.Errorf("%d of 4 partitions claimed", got)
	}
	if lines := logs.Lines(`"msg":"consumer group has more members than input partitions`); len(lines) != 0 {
		t.Errorf("the only member, holding its partitions for their claims, warned that it idles: %s", lines[0])
	}
}

// commitGroupOffsets commits offsets of topic's partitions for group from
// outside the group (no member joins), as a group that consumed with another
// client, or with ratchet in at-least-once mode, leaves them.
func commitGroupOffsets(tb testing.TB, addr, group string, offsets map[int32]int64) {
	tb.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": group, "log_level": 3})
	if err != nil {
		tb.Fatalf("consumer: %v", err)
	}
	defer c.Close()
	t := topic
	var list []kafka.TopicPartition
	for p, off := range offsets {
		list = append(list, kafka.TopicPartition{Topic: &t, Partition: p, Offset: kafka.Offset(off)})
	}
	res, err := c.CommitOffsets(list)
	if err != nil {
		tb.Fatalf("commit offsets: %v", err)
	}
	for _, r := range res {
		if r.Error != nil {
			tb.Fatalf("commit %v: %v", r, r.Error)
		}
	}
}

// produceEvents produces n events to the one partition of topic, so that
// event i is at offset i.
func produceEvents(tb testing.TB, addr string, n int) {
	tb.Helper()
	g := &gen{}
	batch := make([]*ratchetv1.Event, n)
	for i := range batch {
		batch[i] = g.next()
	}
	newProducer(tb, addr).send(tb, batch)
}

// assertAppliedFrom checks that the ledger holds exactly the offsets
// [from, end) of partition 0, each once.
func assertAppliedFrom(tb testing.TB, pool *pgxpool.Pool, from, end int64) {
	tb.Helper()
	testenv.Eventually(tb, 60*time.Second, func() bool {
		return count(tb, pool, `SELECT count(DISTINCT off) FROM test_ledger`) >= end-from
	}, "offsets %d to %d applied", from, end)
	var lo, hi, total, distinct int64
	if err := pool.QueryRow(context.Background(),
		`SELECT coalesce(min(off), -1), coalesce(max(off), -1), count(*), count(DISTINCT off) FROM test_ledger`).
		Scan(&lo, &hi, &total, &distinct); err != nil {
		tb.Fatal(err)
	}
	if lo != from || hi != end-1 || distinct != end-from || total != distinct {
		tb.Errorf("applied offsets %d to %d, %d records, %d distinct; want each of %d to %d once",
			lo, hi, total, distinct, from, end-1)
	}
}

// TestFailedOffsetLookupHoldsThePartition: the group has committed offset
// 100 of 210 and auto_offset_reset is latest. At the assignment ListOffsets
// fails, so the partition is held; at the retries the committed-offset
// lookup (OffsetFetch) fails while ListOffsets answers, as when the group
// coordinator moves. The partition stays held until the lookup answers, and
// then starts at the committed offset: all 110 records after it applied,
// none skipped, and the committed offset at the stop is the end. Before, the
// failed lookup counted as "no committed offset" and the retry placed the
// partition at latest: the 110 records were skipped (in exactly-once mode
// the first claim created the row at the end).
//
// When the lookup already fails at the assignment, librdkafka's own lookup
// for the held partition fails too; before, that left the partition in a
// state every seek refused, and it stayed held for good.
func TestFailedOffsetLookupHoldsThePartition(t *testing.T) {
	for _, tc := range []struct {
		mode string
		// fetchFromStart: OffsetFetch fails from the assignment on, not
		// only at the retries.
		fetchFromStart bool
	}{
		{config.ModeAtLeastOnce, false},
		{config.ModeExactlyOnce, false},
		{config.ModeAtLeastOnce, true},
		{config.ModeExactlyOnce, true},
	} {
		name := tc.mode + "/lookup fails at the retries"
		if tc.fetchFromStart {
			name = tc.mode + "/lookup fails from the assignment on"
		}
		t.Run(name, func(t *testing.T) {
			const committed, end = 100, 210
			cluster, addr := testenv.Kafka(t, 1, topic)
			dbURL := testenv.Postgres(t)
			pool := openPool(t, dbURL)
			createLedger(t, pool)
			produceEvents(t, addr, end)
			cfg := testConfig(t, addr, dbURL, tc.mode)
			cfg.Kafka.AutoOffsetReset = "latest"
			cfg.Retry.InitialBackoff = 200 * time.Millisecond
			cfg.Retry.MaxBackoff = time.Second
			commitGroupOffsets(t, addr, cfg.Kafka.GroupID, map[int32]int64{0: committed})

			failFetch := func() *kfake.FaultHandle {
				return cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetFetch}, Group: cfg.Kafka.GroupID, Topic: topic, Count: -1})
			}
			list := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: topic, Count: -1})
			var fetch *kfake.FaultHandle
			if tc.fetchFromStart {
				fetch = failFetch()
			}
			logs := &testenv.Buffer{}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("engine log:\n%s", logs.String())
				}
			})
			r := runWithLogs(t, cfg, ledger{"a"}, prometheus.NewRegistry(), logs)
			held := `"msg":"cannot claim partition; holding it paused and retrying"`
			claimed := `"msg":"partition claimed after retrying; consuming it"`
			testenv.Eventually(t, 60*time.Second, func() bool { return len(logs.Lines(held)) > 0 },
				"the partition held at the assignment")
			if fetch == nil {
				fetch = failFetch()
			}
			list.Remove()
			// Lookups fail at the retries while ListOffsets answers: the
			// partition must stay held, retry after retry.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := fetch.Wait(ctx, 1); err != nil {
				t.Fatalf("no committed-offset lookup failed: %v", err)
			}
			n := len(logs.Lines(held))
			testenv.Eventually(t, 30*time.Second, func() bool {
				return len(logs.Lines(held)) > n || count(t, pool, `SELECT count(*) FROM test_ledger`) != 0 ||
					len(logs.Lines(claimed)) > 0
			}, "a retry during the failed lookups")
			if lines := logs.Lines(claimed); len(lines) != 0 {
				t.Fatalf("partition started while its committed offset could not be read:\n%s", lines[0])
			}
			if last := logs.Lines(held)[len(logs.Lines(held))-1]; !strings.Contains(last, "read committed offset") {
				t.Errorf("the hold does not name the failed lookup: %s", last)
			}
			fetch.Remove()
			testenv.Eventually(t, 30*time.Second, func() bool { return len(logs.Lines(claimed)) > 0 },
				"the partition claimed once the lookup answers")
			assertAppliedFrom(t, pool, committed, end)
			r.Stop(t)
			assertCommittedAtEnd(t, cluster, cfg.Kafka.GroupID)
			if tc.mode == config.ModeExactlyOnce {
				if got := count(t, pool, `SELECT next_offset FROM ratchet_offsets`); got != end {
					t.Errorf("stored offset %d, want %d", got, end)
				}
			}
		})
	}
}

// TestExactlyOnceStartPosition: a group that consumed with another client
// or in at-least-once mode moves to exactly-once; the offset store has no
// rows. Each partition starts where the group's committed offset is, not at
// auto_offset_reset; a committed offset that retention has deleted starts
// at the log start (logged with the count of records lost), not at the
// reset position librdkafka would fetch from, and so does a stored position
// retention has passed. Before, both fetched from outside the log and
// librdkafka's reset to latest skipped every record.
func TestExactlyOnceStartPosition(t *testing.T) {
	const end = 210
	deletedLine := `"msg":"records were deleted by retention before they were applied; starting at the log start"`
	for _, tc := range []struct {
		name       string
		committed  int64
		stored     int64 // the row's next_offset; -1: no row (first claim)
		deleted    int64 // records retention deleted: the log starts here
		reset      string
		wantFirst  int64
		wantLogged string
	}{
		{"first claim, committed inside the log, latest", 100, -1, 0, "latest", 100, ""},
		{"first claim, committed inside the log, earliest", 100, -1, 0, "earliest", 100, ""},
		{"first claim, committed offset deleted by retention, latest", 50, -1, 100, "latest", 100, deletedLine},
		{"stored position deleted by retention, latest", 50, 50, 100, "latest", 100, deletedLine},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster, addr := testenv.Kafka(t, 1, topic)
			dbURL := testenv.Postgres(t)
			pool := openPool(t, dbURL)
			createLedger(t, pool)
			produceEvents(t, addr, end)
			cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
			cfg.Kafka.AutoOffsetReset = tc.reset
			commitGroupOffsets(t, addr, cfg.Kafka.GroupID, map[int32]int64{0: tc.committed})
			if tc.stored >= 0 {
				ctx := context.Background()
				if err := store.Migrate(ctx, pool); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `INSERT INTO ratchet_offsets (consumer_group, topic, partition, next_offset, epoch, owner, updated_at)
					VALUES ($1, $2, 0, $3, 1, 'before', now())`, cfg.Kafka.GroupID, topic, tc.stored); err != nil {
					t.Fatal(err)
				}
			}
			if tc.deleted > 0 {
				if err := cluster.DeleteRecords(topic, 0, tc.deleted); err != nil {
					t.Fatal(err)
				}
			}
			logs := &testenv.Buffer{}
			r := runWithLogs(t, cfg, ledger{"a"}, prometheus.NewRegistry(), logs)
			assertAppliedFrom(t, pool, tc.wantFirst, end)
			r.Stop(t)
			if got := count(t, pool, `SELECT next_offset FROM ratchet_offsets`); got != end {
				t.Errorf("stored offset %d, want %d", got, end)
			}
			assertCommittedAtEnd(t, cluster, cfg.Kafka.GroupID)
			if tc.wantLogged != "" {
				lines := logs.Lines(tc.wantLogged)
				if len(lines) != 1 || !strings.Contains(lines[0], fmt.Sprintf(`"lost":%d`, tc.deleted-tc.committed)) {
					t.Errorf("want one line %s with the records lost, got %q", tc.wantLogged, lines)
				}
			}
		})
	}
}

// TestNoCommittedOffsetNeedsNoSecondLookup: at-least-once, the group has no
// committed offset and Kafka says so at the assignment; every later
// committed-offset lookup (OffsetFetch) fails, as while the group
// coordinator moves. The partition starts at once at the log start that
// auto_offset_reset earliest names, read with the answer it already has:
// all records applied once. Before, it was assigned at "the committed
// offset", which librdkafka looked up again itself, and nothing was
// applied while that lookup failed.
func TestNoCommittedOffsetNeedsNoSecondLookup(t *testing.T) {
	const end = 60
	cluster, addr := testenv.Kafka(t, 1, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	produceEvents(t, addr, end)
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	// The first lookup after the group's SyncGroup (the engine's, at the
	// assignment) answers; those after it fail.
	var synced atomic.Bool
	var first atomic.Pointer[kmsg.OffsetFetchRequest]
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.SyncGroup}, Observe: true, Count: -1,
		When: func(kmsg.Request) bool { synced.Store(true); return true }})
	fetch := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetFetch}, Group: cfg.Kafka.GroupID, Count: -1,
		When: func(req kmsg.Request) bool { // may be asked more than once for one request
			if !synced.Load() {
				return false
			}
			r := req.(*kmsg.OffsetFetchRequest)
			return !first.CompareAndSwap(nil, r) && first.Load() != r
		}})
	logs := &testenv.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("engine log:\n%s", logs.String())
		}
	})
	r := runWithLogs(t, cfg, ledger{"a"}, prometheus.NewRegistry(), logs)
	testenv.Eventually(t, 30*time.Second, func() bool { return count(t, pool, `SELECT count(*) FROM test_ledger`) >= end },
		"the records applied while later committed-offset lookups fail")
	fetch.Remove()
	assertAppliedFrom(t, pool, 0, end)
	r.Stop(t)
	assertCommittedAtEnd(t, cluster, cfg.Kafka.GroupID)
}

// TestHeldPartitionGivenUpAndBackIsConsumed: a partition held paused for
// its claim is revoked (a second member joins), and comes back to the
// first member once the second leaves. librdkafka keeps a partition's pause
// across a reassignment, so unless the hold's pause is given back with the
// partition, it returns paused and is never fetched again.
func TestHeldPartitionGivenUpAndBackIsConsumed(t *testing.T) {
	const n = 40
	cluster, addr := testenv.Kafka(t, 2, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	pr := newProducer(t, addr)
	g := &gen{}
	send := func() {
		events := make([]*ratchetv1.Event, n)
		for i := range events {
			events[i] = g.next()
		}
		pr.send(t, events)
	}
	send()
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	cfg.Retry.InitialBackoff = 100 * time.Millisecond
	cfg.Retry.MaxBackoff = 500 * time.Millisecond
	list := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: topic, Count: -1})

	aLogs, bLogs := &testenv.Buffer{}, &testenv.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("member a:\n%s\nmember b:\n%s", aLogs.String(), bLogs.String())
		}
	})
	held := `"msg":"cannot claim partition; holding it paused and retrying"`
	a := startWith(t, cfg, engine.Options{Processor: ledger{"a"}, Owner: "a"}, testenv.Log{To: aLogs, JSON: true})
	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(aLogs.Lines(held+`,"owner":"a","topic":"events","partition":0`)) > 0 &&
			len(aLogs.Lines(held+`,"owner":"a","topic":"events","partition":1`)) > 0
	}, "member a holding both partitions")
	b := startWith(t, cfg, engine.Options{Processor: ledger{"b"}, Owner: "b"}, testenv.Log{To: bLogs, JSON: true})
	testenv.Eventually(t, 60*time.Second, func() bool { return len(bLogs.Lines(held)) > 0 },
		"member b holding the partition a gave up")
	list.Remove()
	testenv.Eventually(t, 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(DISTINCT (partition, off)) FROM test_ledger`) == n
	}, "the first records applied once the claims succeed")
	b.Stop(t)
	send()
	testenv.Eventually(t, 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(DISTINCT (partition, off)) FROM test_ledger`) == 2*n
	}, "member a consuming both partitions after b left: %d of the later records applied",
		count(t, pool, `SELECT count(DISTINCT (partition, off)) FROM test_ledger`)-n)
	a.Stop(t)
}
