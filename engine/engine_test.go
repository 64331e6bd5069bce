package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

const topic = "events"

// testConfig is the configuration every engine test starts from.
func testConfig(tb testing.TB, brokers, dbURL string, mode string) config.Config {
	tb.Helper()
	cfg := config.Default()
	cfg.Kafka.Brokers = []string{brokers}
	cfg.Kafka.Topics = []string{topic}
	cfg.Kafka.GroupID = "ratchet-test"
	cfg.Postgres.URL = config.SecretURL(dbURL)
	cfg.Commit.Mode = mode
	cfg.HTTP.Addr = ""
	cfg.Shutdown.Timeout = 20 * time.Second
	if err := cfg.Validate(); err != nil {
		tb.Fatalf("test config: %v", err)
	}
	return cfg
}

// start runs an engine with processor p (nil: the dashboard) as owner until
// the test ends (testenv.Engine: Stop stops it and checks it stopped
// cleanly). Its log is discarded unless RATCHET_TEST_LOG is set.
func start(tb testing.TB, cfg config.Config, p processor.Processor, owner string) *testenv.Engine {
	tb.Helper()
	return startWith(tb, cfg, engine.Options{Processor: p, Owner: owner}, testenv.Log{})
}

// startWith runs an engine with opts until the test ends, logging as log
// says (with the owner, when opts has one).
func startWith(tb testing.TB, cfg config.Config, opts engine.Options, log testenv.Log) *testenv.Engine {
	tb.Helper()
	return testenv.StartEngine(tb, testenv.EngineOptions{Log: log},
		func(ctx context.Context, l *slog.Logger, onListening func(string)) error {
			opts.Logger, opts.OnListening = l, onListening
			if opts.Owner != "" {
				opts.Logger = l.With("owner", opts.Owner)
			}
			return engine.Run(ctx, cfg, opts)
		})
}

// gen makes deterministic events: metrics, minute buckets over an hour,
// integer values so that sums are exact whatever the order of addition.
type gen struct{ n int }

var metricNames = []string{"page_view", "signup", "checkout", "api_latency_ms", "error", "search"}

func (g *gen) next() *ratchetv1.Event {
	i := g.n
	g.n++
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	return &ratchetv1.Event{
		Id:     fmt.Sprintf("ev-%d", i),
		Metric: metricNames[(i*7)%len(metricNames)],
		Value:  float64((i*31)%1000 - 200),
		Time:   timestamppb.New(base.Add(time.Duration((i*13)%3600) * time.Second)),
		Labels: map[string]string{"region": []string{"eu", "us", "ap"}[i%3]},
	}
}

type rollupKey struct {
	metric string
	bucket time.Time
}

type rollup struct {
	count         int64
	sum, min, max float64
}

func expectRollups(events []*ratchetv1.Event) map[rollupKey]rollup {
	out := map[rollupKey]rollup{}
	for _, ev := range events {
		k := rollupKey{ev.Metric, ev.Time.AsTime().UTC().Truncate(time.Minute)}
		r, ok := out[k]
		if !ok {
			r = rollup{min: math.Inf(1), max: math.Inf(-1)}
		}
		r.count++
		r.sum += ev.Value
		r.min = math.Min(r.min, ev.Value)
		r.max = math.Max(r.max, ev.Value)
		out[k] = r
	}
	return out
}

// producer writes events to the test broker and waits for every delivery.
type producer struct {
	p *kafka.Producer
}

func newProducer(tb testing.TB, brokers string) *producer {
	tb.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "linger.ms": 5,
		"enable.idempotence": true, "acks": "all", "log_level": 3})
	if err != nil {
		tb.Fatalf("producer: %v", err)
	}
	tb.Cleanup(p.Close)
	return &producer{p: p}
}

func (pr *producer) send(tb testing.TB, events []*ratchetv1.Event) {
	tb.Helper()
	if err := pr.trySend(events); err != nil {
		tb.Fatal(err)
	}
}

// trySend produces events and waits for their delivery reports; it may run
// on any goroutine.
func (pr *producer) trySend(events []*ratchetv1.Event) error {
	deliveries := make(chan kafka.Event, len(events))
	t := topic
	for _, ev := range events {
		v, err := proto.Marshal(ev)
		if err != nil {
			return fmt.Errorf("marshal: %w", err)
		}
		for {
			err = pr.p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: kafka.PartitionAny},
				Key: []byte(ev.Id), Value: v}, deliveries)
			if err == nil {
				break
			}
			if ke, ok := err.(kafka.Error); ok && ke.Code() == kafka.ErrQueueFull {
				pr.p.Flush(100)
				continue
			}
			return fmt.Errorf("produce: %w", err)
		}
	}
	for range events {
		select {
		case d := <-deliveries:
			if m := d.(*kafka.Message); m.TopicPartition.Error != nil {
				return fmt.Errorf("delivery: %w", m.TopicPartition.Error)
			}
		case <-time.After(60 * time.Second):
			return fmt.Errorf("deliveries did not arrive within 60s")
		}
	}
	return nil
}

func openPool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatalf("pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func readRollups(tb testing.TB, pool *pgxpool.Pool) map[rollupKey]rollup {
	tb.Helper()
	rows, err := pool.Query(context.Background(), `SELECT metric, bucket, count, sum, min, max FROM dashboard_rollups`)
	if err != nil {
		tb.Fatalf("read rollups: %v", err)
	}
	out := map[rollupKey]rollup{}
	for rows.Next() {
		var k rollupKey
		var r rollup
		if err := rows.Scan(&k.metric, &k.bucket, &r.count, &r.sum, &r.min, &r.max); err != nil {
			tb.Fatalf("scan: %v", err)
		}
		k.bucket = k.bucket.UTC()
		out[k] = r
	}
	if rows.Err() != nil {
		tb.Fatalf("read rollups: %v", rows.Err())
	}
	return out
}

func count(tb testing.TB, pool *pgxpool.Pool, q string) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		// The table may not exist before the engine migrated.
		return -1
	}
	return n
}

// assertCommittedAtEnd checks that the group's committed offset of every
// partition equals the partition's end offset.
func assertCommittedAtEnd(tb testing.TB, c *kfake.Cluster, group string) {
	tb.Helper()
	info := c.GroupInfo(group)
	if info == nil {
		tb.Fatalf("group %s unknown to the broker", group)
	}
	for _, p := range c.PartitionInfos(topic) {
		got, ok := info.Commits[topic][p.Partition]
		if p.HighWatermark == 0 && !ok {
			continue
		}
		if !ok || got.Offset != p.HighWatermark {
			tb.Errorf("%s[%d]: committed %v (present %v), end offset %d", topic, p.Partition, got.Offset, ok, p.HighWatermark)
		}
	}
}

func TestEndToEndRollupsExact(t *testing.T) {
	for _, mode := range []string{config.ModeAtLeastOnce, config.ModeExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			const n = 100_000
			cluster, addr := testenv.Kafka(t, 12, topic)
			dbURL := testenv.Postgres(t)
			g := &gen{}
			events := make([]*ratchetv1.Event, n)
			for i := range events {
				events[i] = g.next()
			}
			newProducer(t, addr).send(t, events)

			cfg := testConfig(t, addr, dbURL, mode)
			r := start(t, cfg, nil, "a")
			pool := openPool(t, dbURL)
			testenv.Eventually(t, 120*time.Second, func() bool {
				return count(t, pool, `SELECT coalesce(sum(count),0) FROM dashboard_rollups`) >= n
			}, "all %d events applied", n)
			r.Stop(t)

			want := expectRollups(events)
			got := readRollups(t, pool)
			if len(got) != len(want) {
				t.Errorf("rollup rows: got %d, want %d", len(got), len(want))
			}
			for k, w := range want {
				g := got[k]
				if g.count != w.count || g.sum != w.sum || g.min != w.min || g.max != w.max {
					t.Errorf("%s %s: got %+v, want %+v", k.metric, k.bucket.Format(time.RFC3339), g, w)
				}
			}
			assertCommittedAtEnd(t, cluster, cfg.Kafka.GroupID)
		})
	}
}

// ledger is a processor that writes one row per record, with no unique
// constraint: a replayed record shows up as a duplicate row. owner tells
// which engine applied it.
type ledger struct{ owner string }

func (ledger) Name() string { return "ledger" }

func (l ledger) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	rows := make([][]any, len(b.Records))
	for i, r := range b.Records {
		rows[i] = []any{r.Topic, r.Partition, r.Offset, r.Event.Id, l.owner}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"test_ledger"}, []string{"topic", "partition", "off", "id", "owner"}, pgx.CopyFromRows(rows))
	return err
}

func createLedger(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE test_ledger (topic text, partition int, off bigint, id text, owner text, at timestamptz DEFAULT clock_timestamp())`); err != nil {
		tb.Fatalf("create ledger: %v", err)
	}
}

// assertLedgerExactlyOnce checks every produced id was applied once.
func assertLedgerExactlyOnce(tb testing.TB, pool *pgxpool.Pool, produced int64) {
	tb.Helper()
	total := count(tb, pool, `SELECT count(*) FROM test_ledger`)
	distinct := count(tb, pool, `SELECT count(DISTINCT id) FROM test_ledger`)
	if distinct != produced {
		tb.Errorf("distinct events applied: %d, produced %d (lost %d)", distinct, produced, produced-distinct)
	}
	if total != distinct {
		tb.Errorf("records applied %d times for %d distinct events: %d replayed", total, distinct, total-distinct)
	}
}

// streamer produces batches in the background until stopped and counts
// what was delivered.
type streamer struct {
	stopOnce sync.Once
	stopCh   chan struct{}
	done     chan struct{}
	sent     atomic.Int64
}

func stream(tb testing.TB, addr string, batch int, every time.Duration) *streamer {
	return streamFrom(tb, addr, batch, every, (&gen{}).next)
}

// streamFrom produces batch events from next every interval until stopped.
func streamFrom(tb testing.TB, addr string, batch int, every time.Duration, next func() *ratchetv1.Event) *streamer {
	s := &streamer{stopCh: make(chan struct{}), done: make(chan struct{})}
	pr := newProducer(tb, addr)
	go func() { // ends when stop is called
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stopCh:
				return
			case <-t.C:
			}
			evs := make([]*ratchetv1.Event, batch)
			for i := range evs {
				evs[i] = next()
			}
			if err := pr.trySend(evs); err != nil {
				tb.Errorf("stream: %v", err)
				return
			}
			s.sent.Add(int64(batch))
		}
	}()
	tb.Cleanup(s.stop)
	return s
}

func (s *streamer) stop() {
	s.stopOnce.Do(func() { close(s.stopCh) })
	<-s.done
}

// waitApplied waits until the ledger holds at least n rows.
func waitApplied(tb testing.TB, pool *pgxpool.Pool, n int64) {
	tb.Helper()
	testenv.Eventually(tb, 120*time.Second, func() bool {
		return count(tb, pool, `SELECT count(DISTINCT id) FROM test_ledger`) >= n
	}, "%d records applied", n)
}

// waitMembers waits until the group is stable with n members.
func waitMembers(tb testing.TB, c *kfake.Cluster, group string, n int) {
	tb.Helper()
	waitStable(tb, c, group, n)
}

// waitStable waits until the group is stable with n members and returns
// its state then.
func waitStable(tb testing.TB, c *kfake.Cluster, group string, n int) *kfake.GroupInfo {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	info, err := c.WaitGroupStable(ctx, group, n)
	if err != nil {
		tb.Fatalf("group %s never stable with %d members: %v", group, n, err)
	}
	return info
}

// waitOwnerApplies waits until owner applied more than it has now.
func waitOwnerApplies(tb testing.TB, pool *pgxpool.Pool, owner string) {
	tb.Helper()
	q := fmt.Sprintf(`SELECT count(*) FROM test_ledger WHERE owner = '%s'`, owner)
	before := count(tb, pool, q)
	testenv.Eventually(tb, 90*time.Second, func() bool { return count(tb, pool, q) > before+500 },
		"engine %s applies records", owner)
}

func TestMembershipChangesReplayNothing(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)
	group := cfg.Kafka.GroupID

	s := stream(t, addr, 100, 20*time.Millisecond)
	a := start(t, cfg, ledger{"a"}, "a")
	b := start(t, cfg, ledger{"b"}, "b")
	waitMembers(t, cluster, group, 2)
	waitOwnerApplies(t, pool, "a")
	waitOwnerApplies(t, pool, "b")

	c := start(t, cfg, ledger{"c"}, "c") // joins: a and b each give up partitions
	waitMembers(t, cluster, group, 3)
	waitOwnerApplies(t, pool, "c")
	waitOwnerApplies(t, pool, "a")

	a.Stop(t) // graceful leave while events keep coming
	waitMembers(t, cluster, group, 2)
	waitOwnerApplies(t, pool, "b")
	waitOwnerApplies(t, pool, "c")

	s.stop()
	waitApplied(t, pool, s.sent.Load())
	b.Stop(t)
	c.Stop(t)
	assertLedgerExactlyOnce(t, pool, s.sent.Load())
}

func TestGracefulRestartMidStream(t *testing.T) {
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeAtLeastOnce)

	s := stream(t, addr, 100, 20*time.Millisecond)
	for i := range 3 {
		owner := fmt.Sprintf("run-%d", i)
		r := start(t, cfg, ledger{owner}, owner)
		waitOwnerApplies(t, pool, owner)
		r.Stop(t)
	}
	r := start(t, cfg, ledger{"last"}, "last")
	s.stop()
	waitApplied(t, pool, s.sent.Load())
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, s.sent.Load())
}

// barrier is a processor whose transactions wait inside Process until
// want of them are open at once (or release is closed), and records the
// most it saw.
type barrier struct {
	want    int32
	inside  atomic.Int32
	most    atomic.Int32
	release chan struct{}
}

func (*barrier) Name() string { return "barrier" }

func (b *barrier) Process(ctx context.Context, _ pgx.Tx, _ processor.Batch) error {
	n := b.inside.Add(1)
	defer b.inside.Add(-1)
	for {
		m := b.most.Load()
		if n <= m || b.most.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestEveryPartitionCanApplyAtOnce: with postgres.max_conns at its default
// (0: the input partitions + 4, at most 16) all 12 partitions have a transaction open at
// the same time; a pool smaller than the assignment would make partitions
// queue for connections behind each other's slow transactions.
func TestEveryPartitionCanApplyAtOnce(t *testing.T) {
	const partitions = 12
	_, addr := testenv.Kafka(t, partitions, topic)
	dbURL := testenv.Postgres(t)
	pr := newProducer(t, addr)
	deliveries := make(chan kafka.Event, partitions)
	g := &gen{}
	for p := range int32(partitions) {
		v, err := proto.Marshal(g.next())
		if err != nil {
			t.Fatal(err)
		}
		tp := topic
		if err := pr.p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: p}, Value: v}, deliveries); err != nil {
			t.Fatal(err)
		}
	}
	for range partitions {
		if m := (<-deliveries).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}

	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	if cfg.Postgres.MaxConns != 0 {
		t.Fatalf("postgres.max_conns default is %d, want 0", cfg.Postgres.MaxConns)
	}
	b := &barrier{want: partitions, release: make(chan struct{})}
	start(t, cfg, b, "a")
	defer close(b.release) // before the engine stops (t.Cleanup)
	testenv.Eventually(t, 60*time.Second, func() bool { return b.most.Load() >= b.want },
		"%d transactions open at once", partitions)
}

// TestLostCommitsAreAppliedAgain: with postgres.synchronous_commit off, a
// PostgreSQL crash can undo the last committed transactions. Each takes
// its results and its offset advance with it, so the store moves back
// consistently under the same epoch; the engine, whose partitions are
// further on, must notice at the next batch and apply the lost records
// again, exactly once. The test does to the database what such a crash
// does: it moves every partition's stored offset back and deletes the
// results of the records after it.
func TestLostCommitsAreAppliedAgain(t *testing.T) {
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Postgres.SynchronousCommit = "off"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	s := stream(t, addr, 100, 10*time.Millisecond)
	r := start(t, cfg, ledger{"engine"}, "engine")
	waitApplied(t, pool, 3000)

	// Lock every offset row first (waiting for the batches in flight), so
	// the statement after it sees every result those batches committed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM ratchet_offsets FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	tag, err := tx.Exec(ctx, `
WITH cut AS (
	UPDATE ratchet_offsets SET next_offset = greatest(next_offset - 40, 0)
	RETURNING topic, partition, next_offset)
DELETE FROM test_ledger l USING cut
WHERE l.topic = cut.topic AND l.partition = cut.partition AND l.off >= cut.next_offset`)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() == 0 {
		t.Fatal("the simulated crash undid no results")
	}
	t.Logf("undid %d applied records", tag.RowsAffected())

	waitApplied(t, pool, count(t, pool, `SELECT count(DISTINCT id) FROM test_ledger`)+2000)
	s.stop()
	waitApplied(t, pool, s.sent.Load())
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, s.sent.Load())
}

// TestDefaultPoolSize: postgres.max_conns 0 gives every partition of a small
// assignment its own connection, and never more than DefaultMaxConns.
func TestDefaultPoolSize(t *testing.T) {
	for _, c := range []struct{ partitions, want int }{
		{1, 5}, {12, 16}, {13, engine.DefaultMaxConns}, {1024, engine.DefaultMaxConns},
	} {
		if got := engine.DefaultPoolSize(c.partitions); got != c.want {
			t.Errorf("DefaultPoolSize(%d) = %d, want %d", c.partitions, got, c.want)
		}
	}
}
