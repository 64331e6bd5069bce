package engine_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// panicky wraps the ledger and panics in Process for chosen events.
type panicky struct {
	ledger
	mu     sync.Mutex
	panics int
	seen   map[string]bool
	choose func(id string) bool
	always bool
}

func (p *panicky) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	p.mu.Lock()
	for _, r := range b.Records {
		if p.choose(r.Event.Id) && (p.always || !p.seen[r.Event.Id]) {
			p.seen[r.Event.Id] = true
			p.panics++
			p.mu.Unlock()
			panic("boom on " + r.Event.Id)
		}
	}
	p.mu.Unlock()
	return p.ledger.Process(ctx, tx, b)
}

// runWithLogs runs an engine with its own metrics registry and its JSON
// log collected in logs.
func runWithLogs(tb testing.TB, cfg config.Config, p processor.Processor, reg *prometheus.Registry, logs *testenv.Buffer) *testenv.Engine {
	tb.Helper()
	return startWith(tb, cfg, engine.Options{Processor: p, Registry: reg, Owner: "sup"}, testenv.Log{To: logs, JSON: true})
}

func TestPanicOnceEveryThousandthRecord(t *testing.T) {
	const n = 24_000
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	g := &gen{}
	events := make([]*ratchetv1.Event, n)
	for i := range events {
		events[i] = g.next()
	}
	newProducer(t, addr).send(t, events)

	every := map[string]bool{}
	for i := 999; i < n; i += 1000 {
		every[events[i].Id] = true
	}
	p := &panicky{ledger: ledger{"sup"}, seen: map[string]bool{}, choose: func(id string) bool { return every[id] }}
	reg := prometheus.NewRegistry()
	logs := &testenv.Buffer{}
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	// Batches of 500 alone: panics are counted per batch start, and a
	// batch grown to a partition's whole backlog can hold retry.max_attempts
	// of the chosen records; its last panic then isolates the batch instead
	// of restarting the actor, and the count below is one short.
	cfg.Processing.MaxBatchSize = cfg.Processing.BatchSize
	r := runWithLogs(t, cfg, p, reg, logs)
	waitApplied(t, pool, n)
	r.Stop(t)

	assertLedgerExactlyOnce(t, pool, n)
	p.mu.Lock()
	panics := p.panics
	p.mu.Unlock()
	if panics != len(every) {
		t.Errorf("processor panicked %d times, want %d", panics, len(every))
	}
	restarts := testutil.ToFloat64(metricVec(t, reg, "ratchet_actor_restarts_total"))
	if int(restarts) != panics {
		t.Errorf("ratchet_actor_restarts_total = %v, want %d", restarts, panics)
	}
	lines := logs.Lines(`"msg":"partition actor restarted"`)
	if len(lines) != panics {
		t.Errorf("%d restart log lines, want %d", len(lines), panics)
	}
	for _, l := range lines {
		for _, key := range []string{`"topic":"events"`, `"partition":`, `"offset":`, `"reason":"processor panic: boom on`, `"restarts":`} {
			if !strings.Contains(l, key) {
				t.Errorf("restart line lacks %s: %s", key, l)
			}
		}
	}
}

func TestRecordThatAlwaysPanicsIsIsolated(t *testing.T) {
	const n = 6_000
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	g := &gen{}
	events := make([]*ratchetv1.Event, n)
	for i := range events {
		events[i] = g.next()
	}
	newProducer(t, addr).send(t, events)

	bad := events[2500].Id
	p := &panicky{ledger: ledger{"sup"}, seen: map[string]bool{}, always: true, choose: func(id string) bool { return id == bad }}
	reg := prometheus.NewRegistry()
	logs := &testenv.Buffer{}
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	r := runWithLogs(t, cfg, p, reg, logs)
	waitApplied(t, pool, n-1)
	r.Stop(t)

	assertLedgerExactlyOnce(t, pool, n-1)
	if got := count(t, pool, `SELECT count(*) FROM test_ledger WHERE id = '`+bad+`'`); got != 0 {
		t.Errorf("the panicking record was applied %d times", got)
	}
	limit := min(cfg.Retry.MaxAttempts, cfg.Supervision.MaxRestarts)
	if got := testutil.ToFloat64(metricVec(t, reg, "ratchet_actor_restarts_total")); int(got) != limit-1 {
		t.Errorf("ratchet_actor_restarts_total = %v restarts before isolating, want %d", got, limit-1)
	}
	// A record the processor refuses is a dead letter, not poison.
	if got := testutil.ToFloat64(metricVec(t, reg, "ratchet_dead_letters_total")); got != 1 {
		t.Errorf("ratchet_dead_letters_total = %v, want 1: %v", got, logs.Lines(`dead letter`))
	}
	if got := testutil.ToFloat64(metricVec(t, reg, "ratchet_poison_records_total")); got != 0 {
		t.Errorf("ratchet_poison_records_total = %v, want 0", got)
	}
}

// metricVec returns the collector registered under name.
func metricVec(tb testing.TB, reg *prometheus.Registry, name string) prometheus.Collector {
	tb.Helper()
	return gathererCollector{reg: reg, name: name}
}

// gathererCollector re-exposes one metric family of a registry so that
// testutil.ToFloat64 can sum it.
type gathererCollector struct {
	reg  *prometheus.Registry
	name string
}

func (g gathererCollector) Describe(chan<- *prometheus.Desc) {}

func (g gathererCollector) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != g.name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "sum", nil, nil), prometheus.UntypedValue, sum)
}

func TestRecycleTwentyTimesReplaysNothing(t *testing.T) {
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	cfg.Kafka.RecycleInterval = time.Second
	reg := prometheus.NewRegistry()
	logs := &testenv.Buffer{}
	s := stream(t, addr, 50, 20*time.Millisecond)
	r := runWithLogs(t, cfg, ledger{"sup"}, reg, logs)
	rebuilds := func() float64 { return testutil.ToFloat64(metricVec(t, reg, "ratchet_consumer_rebuilds_total")) }
	testenv.Eventually(t, 180*time.Second, func() bool { return rebuilds() >= 20 },
		"20 consumer rebuilds")
	s.stop()
	waitApplied(t, pool, s.sent.Load())
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, s.sent.Load())

	// Every rebuild drained and flushed before the consumer was closed.
	// Only the log has the order of the three steps; the ledger above
	// shows what the order guarantees.
	var state string
	for _, line := range logs.Lines(`"msg":`) {
		switch {
		case strings.Contains(line, `"msg":"rebuilding the consumer: draining and flushing first"`):
			state = "draining"
		case strings.Contains(line, `"msg":"offsets flushed"`) && state == "draining":
			state = "flushed"
		case strings.Contains(line, `"msg":"consumer closed; building a new one"`):
			if state != "flushed" {
				t.Fatalf("consumer rebuilt without a flush first (state %q)", state)
			}
			state = ""
		}
	}
}

func TestFencedStaticMemberStopsWithoutHanging(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Kafka.InstanceID = "pod-0"
	cfg.Shutdown.Timeout = 10 * time.Second
	s := stream(t, addr, 50, 20*time.Millisecond)

	logsA := &testenv.Buffer{}
	a := runWithLogs(t, cfg, ledger{"a"}, prometheus.NewRegistry(), logsA)
	waitMembers(t, cluster, cfg.Kafka.GroupID, 1)
	waitOwnerApplies(t, pool, "a")

	b := runWithLogs(t, cfg, ledger{"b"}, prometheus.NewRegistry(), &testenv.Buffer{}) // same instance id
	// It stops by itself; a hang here is a Close that never returns.
	if err := a.Wait(t, 90*time.Second); err == nil || !strings.Contains(err.Error(), "fenced static member") {
		t.Fatalf("fenced engine returned %v, want a fenced static member error", err)
	}
	if len(logsA.Lines(`"msg":"fatal consumer error"`)) == 0 {
		t.Error("the fatal error was not logged")
	}
	waitOwnerApplies(t, pool, "b") // the new owner goes on
	s.stop()
	waitApplied(t, pool, s.sent.Load())
	b.Stop(t)
	assertLedgerExactlyOnce(t, pool, s.sent.Load())
}

// TestStaticMemberRestartReplaysNothing restarts a static member
// (kafka.instance_id) under load. The restart is not free of rebalances:
// cooperative-sticky puts the owned partitions in the subscription metadata
// (KIP-429), and a static member that rejoins with changed metadata is
// rebalanced, by kfake as by Apache Kafka. The rebalance is incremental
// and every revoke flushes, so nothing is replayed or lost.
func TestStaticMemberRestartReplaysNothing(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg0 := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	cfg0.Kafka.InstanceID = "pod-0"
	cfg1 := cfg0
	cfg1.Kafka.InstanceID = "pod-1"
	s := stream(t, addr, 50, 20*time.Millisecond)
	a := start(t, cfg0, ledger{"a"}, "a")
	b := start(t, cfg1, ledger{"b"}, "b")
	waitStable(t, cluster, cfg0.Kafka.GroupID, 2)
	waitOwnerApplies(t, pool, "a")
	waitOwnerApplies(t, pool, "b")
	a.Stop(t)
	a2 := start(t, cfg0, ledger{"a2"}, "a2")
	waitOwnerApplies(t, pool, "a2")
	waitOwnerApplies(t, pool, "b")
	s.stop()
	waitApplied(t, pool, s.sent.Load())
	a2.Stop(t)
	b.Stop(t)
	assertLedgerExactlyOnce(t, pool, s.sent.Load())
}

func TestWarnsWhenMembersOutnumberPartitions(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 2, topic)
	dbURL := testenv.Postgres(t)
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	logs := &testenv.Buffer{}
	var rs []*testenv.Engine
	for range 3 {
		rs = append(rs, runWithLogs(t, cfg, ledger{"x"}, prometheus.NewRegistry(), logs))
	}
	waitMembers(t, cluster, cfg.Kafka.GroupID, 3)
	testenv.Eventually(t, 60*time.Second, func() bool {
		return len(logs.Lines(`"msg":"consumer group has more members than input partitions; the extra members idle"`)) > 0
	}, "a warning about the idle member")
	for _, l := range logs.Lines(`"msg":"consumer group has more members than input partitions`) {
		if !strings.Contains(l, `"partitions":2`) || !strings.Contains(l, `"assigned":0`) {
			t.Errorf("warning should give the partition count: %s", l)
		}
	}
	if len(logs.Lines(`"msg":"input topic"`)) == 0 {
		t.Error("the input topic's partition count was not logged at start")
	}
	for _, r := range rs {
		r.Stop(t)
	}
}

// partitionPanics panics on every record of one partition: many distinct
// records, each a fresh failure.
type partitionPanics struct {
	ledger
	partition int32
}

func (p partitionPanics) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	if b.Partition == p.partition && len(b.Records) > 0 {
		panic("boom on partition " + b.Topic)
	}
	return p.ledger.Process(ctx, tx, b)
}

// TestRestartBudgetStopsTheEngine: a partition whose processor keeps
// panicking on different records uses up supervision.max_restarts; the
// engine then drains and flushes the other partitions and stops with an
// error that says why (the process exits 1 and its container restarts).
// Before, the signal was dropped: the partition stayed paused for good and
// nothing exited.
func TestRestartBudgetStopsTheEngine(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	g := &gen{}
	evs := make([]*ratchetv1.Event, 4000)
	for i := range evs {
		evs[i] = g.next()
	}
	newProducer(t, addr).send(t, evs)

	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	cfg.Supervision.MaxRestarts = 3
	cfg.Supervision.Within = time.Minute
	// Batches of 500 alone: the first batch of partition 0 is isolated
	// (its 500 records dead-lettered) and the next one panics again; a
	// batch grown to the partition's 1000 records would leave no next one.
	cfg.Processing.MaxBatchSize = cfg.Processing.BatchSize
	logs := &testenv.Buffer{}
	e := startWith(t, cfg, engine.Options{Processor: partitionPanics{ledger{"a"}, 0}, Owner: "a",
		Registry: prometheus.NewRegistry()}, testenv.Log{To: logs, JSON: true})
	if err := e.Wait(t, 90*time.Second); err == nil || !strings.Contains(err.Error(), "restart budget") {
		t.Fatalf("engine stopped with %v, want the restart budget error", err)
	}
	if len(logs.Lines(`partition actor over its restart budget; stopping the engine`)) == 0 {
		t.Error("no log line says why the engine stopped")
	}
	// The other partitions were drained and flushed: Kafka has what they
	// applied.
	info := cluster.GroupInfo(cfg.Kafka.GroupID)
	for p := int32(1); p < 4; p++ {
		var next int64
		if err := pool.QueryRow(context.Background(),
			`SELECT coalesce(max(off) + 1, 0) FROM test_ledger WHERE partition = $1`, p).Scan(&next); err != nil {
			t.Fatal(err)
		}
		if next == 0 {
			t.Errorf("partition %d applied nothing", p)
			continue
		}
		if got := info.Commits[topic][p].Offset; got != next {
			t.Errorf("partition %d: committed %d, applied up to %d", p, got, next)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM test_ledger WHERE partition = 0`); got != 0 {
		t.Errorf("partition 0 applied %d records", got)
	}
}
