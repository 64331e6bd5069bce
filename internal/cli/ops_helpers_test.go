package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// The operations tests run the engine in this process, as the engine
// tests do, against kfake and a fresh PostgreSQL database, and run the
// commands through Run with the same configuration in the environment.

const opsTopic = "events"

// opsEnv is one test's broker, database and configuration.
type opsEnv struct {
	addr  string
	db    string
	mode  string
	pool  *pgxpool.Pool
	extra []string
}

func newOpsEnv(tb testing.TB, addr, mode string) *opsEnv {
	tb.Helper()
	o := &opsEnv{addr: addr, db: testenv.Postgres(tb), mode: mode}
	pool, err := pgxpool.New(context.Background(), o.db)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	o.pool = pool
	if err := store.Migrate(context.Background(), pool); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE test_ledger (partition int, off bigint, id text, val double precision, owner text)`); err != nil {
		tb.Fatal(err)
	}
	return o
}

func (o *opsEnv) environ() []string {
	return append([]string{
		"RATCHET_KAFKA_BROKERS=" + o.addr,
		"RATCHET_POSTGRES_URL=" + o.db,
		"RATCHET_COMMIT_MODE=" + o.mode,
		"RATCHET_KAFKA_TOPICS=" + opsTopic,
		"RATCHET_KAFKA_GROUP_ID=ratchet-ops-test",
		"RATCHET_COMMIT_INTERVAL=100ms",
		"RATCHET_HTTP_ADDR=127.0.0.1:0",
		"RATCHET_SHUTDOWN_TIMEOUT=20s",
		"RATCHET_RETRY_INITIAL_BACKOFF=10ms",
		"RATCHET_RETRY_MAX_BACKOFF=50ms",
	}, o.extra...)
}

func (o *opsEnv) config(tb testing.TB) config.Config {
	tb.Helper()
	cfg, err := config.Load("", o.environ())
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// run runs one command line with this environment.
func (o *opsEnv) run(tb testing.TB, args ...string) (int, string, string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := Run(ctx, args, o.environ(), &out, &errOut)
	return code, out.String(), errOut.String()
}

// mustRun runs a command line that must exit 0.
func (o *opsEnv) mustRun(tb testing.TB, args ...string) string {
	tb.Helper()
	code, out, errOut := o.run(tb, args...)
	if code != ExitOK {
		tb.Fatalf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errOut)
	}
	return out
}

func (o *opsEnv) count(tb testing.TB, q string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := o.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	return n
}

// startEngine runs an engine in this process as owner until the test ends
// (testenv.Engine); its page's address arrives on Listening.
func startEngine(tb testing.TB, cfg config.Config, p processor.Processor, owner string) *testenv.Engine {
	tb.Helper()
	return testenv.StartEngine(tb, testenv.EngineOptions{},
		func(ctx context.Context, log *slog.Logger, onListening func(string)) error {
			return engine.Run(ctx, cfg, engine.Options{Processor: p, Logger: log.With("owner", owner), Owner: owner,
				OnListening: onListening})
		})
}

// ledger writes one row per record with no unique constraint, so a record
// applied twice shows as two rows. While it is shut, each batch waits for a
// permit from gate first (before it writes anything, so it holds no
// transaction); waiting counts the batches waiting.
type ledger struct {
	owner   string
	gate    chan struct{} // one permit per receive
	waiting atomic.Int64
	mu      sync.Mutex
	opened  chan struct{} // nil: open; else closed by open
}

func newLedger(owner string) *ledger { return &ledger{owner: owner, gate: make(chan struct{})} }

func (*ledger) Name() string { return "ledger" }

func (l *ledger) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	l.mu.Lock()
	opened := l.opened
	l.mu.Unlock()
	if opened != nil {
		l.waiting.Add(1)
		select {
		case <-l.gate:
		case <-opened:
		case <-ctx.Done():
			l.waiting.Add(-1)
			return ctx.Err()
		}
		l.waiting.Add(-1)
	}
	rows := make([][]any, len(b.Records))
	for i, r := range b.Records {
		rows[i] = []any{r.Partition, r.Offset, r.Event.Id, r.Event.Value, l.owner}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"test_ledger"}, []string{"partition", "off", "id", "val", "owner"}, pgx.CopyFromRows(rows))
	return err
}

// shut makes every batch from now on wait for a permit or open.
func (l *ledger) shut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.opened == nil {
		l.opened = make(chan struct{})
	}
}

// open lets every batch through, the waiting ones too.
func (l *ledger) open() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.opened != nil {
		close(l.opened)
		l.opened = nil
	}
}

// sent is one produced record and where it landed.
type sent struct {
	id        string
	partition int32
	offset    int64
}

// kafkaProducer produces events to the test broker and waits for each
// delivery.
type kafkaProducer struct {
	p  *kafka.Producer
	mu sync.Mutex
	n  int
}

func newKafkaProducer(tb testing.TB, addr string) *kafkaProducer {
	tb.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "linger.ms": 5, "enable.idempotence": true,
		"acks": "all", "log_level": 3})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return &kafkaProducer{p: p}
}

// eventBytes returns a valid event, encoded; value is its value.
func eventBytes(id string, value float64) []byte {
	b, _ := proto.Marshal(&ratchetv1.Event{Id: id, Metric: "page_view", Value: value,
		Time: timestamppb.New(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))})
	return b
}

// send produces n events to partition (kafka.PartitionAny: any) with values
// from value(i), and returns them once all are delivered.
func (kp *kafkaProducer) send(partition int32, n int, value func(i int) float64, headers []kafka.Header, ts time.Time) ([]sent, error) {
	kp.mu.Lock()
	first := kp.n
	kp.n += n
	kp.mu.Unlock()
	deliveries := make(chan kafka.Event, n)
	t := opsTopic
	for i := 0; i < n; i++ {
		id := "ev-" + strconv.Itoa(first+i)
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: partition}, Key: []byte(id),
			Value: eventBytes(id, value(first+i)), Headers: headers, Timestamp: ts}
		if err := kp.p.Produce(m, deliveries); err != nil {
			return nil, err
		}
	}
	out := make([]sent, 0, n)
	for range n {
		select {
		case ev := <-deliveries:
			m := ev.(*kafka.Message)
			if m.TopicPartition.Error != nil {
				return nil, m.TopicPartition.Error
			}
			out = append(out, sent{id: string(m.Key), partition: m.TopicPartition.Partition, offset: int64(m.TopicPartition.Offset)})
		case <-time.After(60 * time.Second):
			return nil, fmt.Errorf("deliveries did not arrive within 60s")
		}
	}
	return out, nil
}

func positive(int) float64 { return 1 }

// movedRows parses the rows of `offsets reset --execute` output that say
// "moved": partition → from, to.
func movedRows(tb testing.TB, out string) map[int32][2]int64 {
	tb.Helper()
	m := map[int32][2]int64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 6 || f[5] != "moved" {
			continue
		}
		p, _ := strconv.Atoi(f[1])
		from, err1 := strconv.ParseInt(f[2], 10, 64)
		to, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil {
			tb.Fatalf("unparsable row %q", line)
		}
		m[int32(p)] = [2]int64{from, to}
	}
	return m
}
