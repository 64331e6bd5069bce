// Package faults runs the engine through the faults we can inject — broker
// and database outages, slow statements, failing commits, poison floods,
// odd topics and records — and checks the same invariants after each:
// nothing lost, nothing applied twice, the DLQ holds exactly the poison
// records, and neither Kafka's committed offsets nor the stored offsets
// ever move backwards.
package faults

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

const topic = "events"

// harness is one broker, one database behind a fault proxy, and the
// observers of the invariants.
type harness struct {
	t       *testing.T
	cluster *kfake.Cluster
	addr    string
	dbURL   string // direct, for the checks
	proxy   *testenv.Proxy
	pool    *pgxpool.Pool
	cfg     config.Config

	mu       sync.Mutex
	commits  map[string]map[int32]int64 // topic → partition → last committed
	rewinds  []string
	produced []*record
	seq      int
	// rollups: the engine runs the dashboard processor (a ratchet process),
	// so "applied" is sum(count) of dashboard_rollups, not the ledger.
	rollups bool
}

type record struct {
	key, value []byte
	id         string // empty: poison
	partition  int32
	offset     int64
}

func newHarness(t *testing.T, partitions int32, mode string) *harness {
	t.Helper()
	h := &harness{t: t, commits: map[string]map[int32]int64{}}
	h.cluster, h.addr = testenv.Kafka(t, partitions, topic, topic+".dlq")
	h.dbURL = testenv.Postgres(t)
	var err error
	h.pool, err = pgxpool.New(context.Background(), h.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.pool.Close)
	h.proxy = testenv.NewProxy(t, "127.0.0.1:5432")
	proxied := h.dbURL
	proxied = replaceHost(proxied, h.proxy.Addr())
	h.exec(`CREATE TABLE test_ledger (id text, partition int, off bigint)`)
	h.watchCommits()

	cfg := config.Default()
	cfg.Kafka.Brokers = []string{h.addr}
	cfg.Kafka.Topics = []string{topic}
	cfg.Kafka.GroupID = "faults"
	cfg.Postgres.URL = config.SecretURL(proxied)
	cfg.Commit.Mode = mode
	cfg.HTTP.Addr = ""
	cfg.Shutdown.Timeout = 20 * time.Second
	cfg.Retry.MaxBackoff = 2 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h.cfg = cfg
	return h
}

func replaceHost(dbURL, hostport string) string {
	// testenv URLs are postgres://user@127.0.0.1:5432/db?...
	const from = "127.0.0.1:5432"
	for i := 0; i+len(from) <= len(dbURL); i++ {
		if dbURL[i:i+len(from)] == from {
			return dbURL[:i] + hostport + dbURL[i+len(from):]
		}
	}
	return dbURL
}

func (h *harness) exec(sql string) {
	h.t.Helper()
	if _, err := h.pool.Exec(context.Background(), sql); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
}

// watchCommits observes every OffsetCommit the broker receives and records
// any that would move a partition's committed offset backwards.
func (h *harness) watchCommits() {
	h.cluster.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		oc := req.(*kmsg.OffsetCommitRequest)
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, t := range oc.Topics {
			m := h.commits[t.Topic]
			if m == nil {
				m = map[int32]int64{}
				h.commits[t.Topic] = m
			}
			for _, p := range t.Partitions {
				if prev, ok := m[p.Partition]; ok && p.Offset < prev {
					h.rewinds = append(h.rewinds, fmt.Sprintf("%s[%d]: commit %d after %d", t.Topic, p.Partition, p.Offset, prev))
				}
				if p.Offset > m[p.Partition] {
					m[p.Partition] = p.Offset
				}
			}
		}
		return nil, nil, false
	})
}

// forgetCommits restarts the commit observation (the topic was recreated).
func (h *harness) forgetCommits() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commits = map[string]map[int32]int64{}
}

// storedWatch samples ratchet_offsets until stopped and reports a
// position that moved backwards.
func (h *harness) storedWatch() func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // ends when stop is closed
		defer close(done)
		last := map[int32]int64{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond): // sampling period of the invariant
			}
			rows, err := h.pool.Query(context.Background(), `SELECT partition, next_offset FROM ratchet_offsets WHERE topic = $1`, topic)
			if err != nil {
				continue
			}
			for rows.Next() {
				var p int32
				var n int64
				if rows.Scan(&p, &n) == nil {
					if prev, ok := last[p]; ok && n < prev {
						h.mu.Lock()
						h.rewinds = append(h.rewinds, fmt.Sprintf("stored %s[%d]: %d after %d", topic, p, n, prev))
						h.mu.Unlock()
					}
					last[p] = n
				}
			}
			rows.Close()
		}
	}()
	return func() { close(stop); <-done }
}

// ledger writes one row per applied event.
type ledger struct{}

func (ledger) Name() string { return "ledger" }

func (ledger) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	rows := make([][]any, len(b.Records))
	for i, r := range b.Records {
		rows[i] = []any{r.Event.Id, r.Partition, r.Offset}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"test_ledger"}, []string{"id", "partition", "off"}, pgx.CopyFromRows(rows))
	return err
}

// start runs an engine with the ledger processor until the test ends.
func (h *harness) start(cfg config.Config) *testenv.Engine {
	return h.startWith(cfg, nil)
}

// startWith is start with the engine's metrics in reg (nil: its own). The
// log is discarded unless RATCHET_TEST_LOG is set; a stop may take 90s
// (a drain behind a cut database or broker).
func (h *harness) startWith(cfg config.Config, reg *prometheus.Registry) *testenv.Engine {
	h.t.Helper()
	return testenv.StartEngine(h.t, testenv.EngineOptions{StopWithin: 90 * time.Second},
		func(ctx context.Context, log *slog.Logger, _ func(string)) error {
			return engine.Run(ctx, cfg, engine.Options{Processor: ledger{}, Logger: log, Registry: reg})
		})
}

// produceN produces n records from the demo generator (poison included) and
// remembers where each landed.
func (h *harness) produceN(n int, o produce.Options) {
	h.t.Helper()
	h.mu.Lock()
	seed := int64(h.seq + 1)
	h.seq++
	h.mu.Unlock()
	if o.Seed == 0 {
		o.Seed = seed
	}
	o.Format = event.FormatProtobuf
	g := produce.NewGenerator(o)
	recs := make([]*record, n)
	for i := range recs {
		k, v, ev, _ := g.Next()
		r := &record{key: k, value: v}
		if ev != nil {
			r.id = ev.Id
		}
		recs[i] = r
	}
	h.send(recs, nil)
}

// send produces recs, with an optional per-record key override.
func (h *harness) send(recs []*record, props kafka.ConfigMap) {
	h.t.Helper()
	cm := kafka.ConfigMap{"bootstrap.servers": h.addr, "linger.ms": 5, "enable.idempotence": true, "acks": "all", "log_level": 3}
	for k, v := range props {
		cm[k] = v
	}
	p, err := kafka.NewProducer(&cm)
	if err != nil {
		h.t.Fatal(err)
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, len(recs))
	tp := topic
	for _, r := range recs {
		for {
			err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: kafka.PartitionAny},
				Key: r.key, Value: r.value, Opaque: r}, deliveries)
			if err == nil {
				break
			}
			var ke kafka.Error
			if errors.As(err, &ke) && ke.Code() == kafka.ErrQueueFull {
				p.Flush(100)
				continue
			}
			h.t.Fatalf("produce: %v", err)
		}
	}
	for range recs {
		select {
		case d := <-deliveries:
			m := d.(*kafka.Message)
			if m.TopicPartition.Error != nil {
				h.t.Fatalf("delivery: %v", m.TopicPartition.Error)
			}
			r := m.Opaque.(*record)
			r.partition, r.offset = m.TopicPartition.Partition, int64(m.TopicPartition.Offset)
		case <-time.After(60 * time.Second):
			h.t.Fatal("deliveries did not arrive within 60s")
		}
	}
	h.mu.Lock()
	h.produced = append(h.produced, recs...)
	h.mu.Unlock()
}

func (h *harness) count(q string) int64 {
	var n int64
	if err := h.pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		return -1
	}
	return n
}

func (h *harness) good() (good, poison []*record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.produced {
		if r.id == "" {
			poison = append(poison, r)
		} else {
			good = append(good, r)
		}
	}
	return good, poison
}

// waitApplied waits until every good record produced so far is applied.
func (h *harness) waitApplied(timeout time.Duration) {
	h.t.Helper()
	good, _ := h.good()
	want := int64(len(good))
	q := `SELECT count(DISTINCT id) FROM test_ledger`
	if h.rollups {
		q = `SELECT coalesce(sum(count), 0) FROM dashboard_rollups`
	}
	testenv.Eventually(h.t, timeout, func() bool { return h.count(q) >= want },
		"%d good records applied (have %d)", want, h.count(q))
}

// check asserts the invariants. replaysAllowed is for at-least-once
// scenarios that kill processes; every other scenario must replay nothing.
func (h *harness) check(replaysAllowed bool) {
	h.t.Helper()
	good, poison := h.good()
	distinct := h.count(`SELECT count(DISTINCT id) FROM test_ledger`)
	total := h.count(`SELECT count(*) FROM test_ledger`)
	if h.rollups {
		// Exactly-once into the rollups: every good event counted once.
		distinct = h.count(`SELECT coalesce(sum(count), 0) FROM dashboard_rollups`)
		total = distinct
		if distinct > int64(len(good)) {
			h.t.Errorf("replayed: %d counted for %d good records", distinct, len(good))
		}
	}
	if distinct != int64(len(good)) {
		h.t.Errorf("lost: %d of %d good records applied", distinct, len(good))
	}
	if total != distinct && !replaysAllowed {
		h.t.Errorf("replayed: %d rows for %d records", total, distinct)
	}
	h.mu.Lock()
	for _, r := range h.rewinds {
		h.t.Errorf("offset moved backwards: %s", r)
	}
	h.mu.Unlock()
	h.checkDLQ(poison)
}

// checkDLQ asserts the dead-letter topic holds exactly the poison records.
func (h *harness) checkDLQ(poison []*record) {
	h.t.Helper()
	dlq := h.cfg.Kafka.DLQTopic(topic)
	testenv.Eventually(h.t, 60*time.Second, func() bool {
		var n int64
		for _, p := range h.cluster.PartitionInfos(dlq) {
			n += p.HighWatermark
		}
		return n >= int64(len(poison))
	}, "%d records in the DLQ", len(poison))
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": h.addr, "group.id": "dlq-check", "log_level": 3})
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	var parts []kafka.TopicPartition
	var total int64
	for _, p := range h.cluster.PartitionInfos(dlq) {
		parts = append(parts, kafka.TopicPartition{Topic: &dlq, Partition: p.Partition, Offset: kafka.OffsetBeginning})
		total += p.HighWatermark
	}
	if err := c.Assign(parts); err != nil {
		h.t.Fatal(err)
	}
	type po struct {
		p int32
		o int64
	}
	seen := map[po]bool{}
	deadline := time.Now().Add(60 * time.Second)
	for n := int64(0); n < total && time.Now().Before(deadline); {
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			continue
		}
		n++
		var k po
		for _, hd := range m.Headers {
			v, _ := strconv.ParseInt(string(hd.Value), 10, 64)
			switch hd.Key {
			case "ratchet.partition":
				k.p = int32(v)
			case "ratchet.offset":
				k.o = v
			}
		}
		seen[k] = true
	}
	want := map[po]bool{}
	for _, r := range poison {
		want[po{r.partition, r.offset}] = true
		if !seen[po{r.partition, r.offset}] {
			h.t.Errorf("poison record %d@%d missing from the DLQ", r.partition, r.offset)
		}
	}
	for k := range seen {
		if !want[k] {
			h.t.Errorf("DLQ holds %d@%d, which is not poison", k.p, k.o)
		}
	}
}
