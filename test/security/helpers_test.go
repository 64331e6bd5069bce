// Package security tests ratchet's security properties end to end: SASL and
// TLS to Kafka through kafka.properties, PostgreSQL's sslmode, secrets kept
// out of every log line, page and error, and the HTTP server's exposure
// (loopback by default, read-only, bounded timeouts).
package security

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

const (
	topic    = "events"
	saslUser = "admin"
	// saslPassword is planted in kafka.properties; no output may show it.
	saslPassword = "s3cret-planted"
	scram256     = "SCRAM-SHA-256"
)

// saslProps are the kafka.properties that authenticate as saslUser.
func saslProps(password string) config.Properties {
	return config.Properties{
		"security.protocol": "SASL_PLAINTEXT",
		"sasl.mechanism":    scram256,
		"sasl.username":     saslUser,
		"sasl.password":     password,
	}
}

// testConfig is the configuration every test here starts from: no HTTP,
// short drain.
func testConfig(tb testing.TB, brokers, dbURL string, props config.Properties) config.Config {
	tb.Helper()
	cfg := config.Default()
	cfg.Kafka.Brokers = []string{brokers}
	cfg.Kafka.Topics = []string{topic}
	cfg.Kafka.GroupID = "ratchet-security"
	cfg.Kafka.Properties = props
	cfg.Postgres.URL = config.SecretURL(dbURL)
	cfg.HTTP.Addr = ""
	cfg.Shutdown.Timeout = 10 * time.Second
	cfg.Retry.InitialBackoff = 10 * time.Millisecond
	cfg.Retry.MaxBackoff = 100 * time.Millisecond
	if err := cfg.Validate(); err != nil {
		tb.Fatalf("test config: %v", err)
	}
	return cfg
}

// debugLog is how every engine here logs: JSON at debug level, into buf,
// so that tests can look for secrets in every line.
func debugLog(buf *testenv.Buffer) testenv.Log {
	return testenv.Log{To: buf, JSON: true, Level: slog.LevelDebug}
}

// running is one engine started by a test.
type running struct {
	*testenv.Engine
	logs *testenv.Buffer
	addr string // HTTP address, when serving
}

// start runs the engine in the background with a debug JSON logger. When
// cfg.HTTP.Addr is set it waits until the server listens. The engine is
// stopped when the test ends (testenv.Engine.Stop).
func start(tb testing.TB, cfg config.Config) *running {
	tb.Helper()
	r := &running{logs: &testenv.Buffer{}}
	r.Engine = startEngine(tb, cfg, debugLog(r.logs))
	if cfg.HTTP.Addr != "" {
		r.addr = r.Addr(tb, 60*time.Second)
	}
	return r
}

// startEngine runs the engine as the owner "security", logging as log says.
func startEngine(tb testing.TB, cfg config.Config, log testenv.Log) *testenv.Engine {
	tb.Helper()
	return testenv.StartEngine(tb, testenv.EngineOptions{Log: log},
		func(ctx context.Context, l *slog.Logger, onListening func(string)) error {
			return engine.Run(ctx, cfg, engine.Options{Logger: l, Owner: "security", OnListening: onListening})
		})
}

// events makes n valid events, in distinct minute buckets of one metric.
func events(n int) []*ratchetv1.Event {
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	out := make([]*ratchetv1.Event, n)
	for i := range out {
		out[i] = &ratchetv1.Event{Id: fmt.Sprintf("ev-%d", i), Metric: "page_view", Value: float64(i),
			Time: timestamppb.New(base.Add(time.Duration(i) * time.Second))}
	}
	return out
}

// record is one raw record to produce.
type record struct{ key, value []byte }

// encode returns the records of evs plus poison records that no decoder
// accepts.
func encode(tb testing.TB, evs []*ratchetv1.Event, poison int) []record {
	tb.Helper()
	var out []record
	for _, ev := range evs {
		v, err := proto.Marshal(ev)
		if err != nil {
			tb.Fatalf("marshal: %v", err)
		}
		out = append(out, record{key: []byte(ev.Id), value: v})
	}
	for i := range poison {
		out = append(out, record{key: fmt.Appendf(nil, "poison-%d", i), value: []byte("\xff\xff\xff\xff poison")})
	}
	return out
}

// produceAll writes recs to topic through a producer configured with props
// (the same security settings as the engine) and waits for every delivery.
func produceAll(tb testing.TB, brokers string, props config.Properties, recs []record) {
	tb.Helper()
	cm := kafka.ConfigMap{"bootstrap.servers": brokers, "linger.ms": 5, "acks": "all", "log_level": 3}
	for k, v := range props {
		cm[k] = v
	}
	p, err := kafka.NewProducer(&cm)
	if err != nil {
		tb.Fatalf("producer: %v", err)
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, len(recs))
	t := topic
	for _, r := range recs {
		err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: kafka.PartitionAny},
			Key: r.key, Value: r.value}, deliveries)
		if err != nil {
			tb.Fatalf("produce: %v", err)
		}
	}
	timeout := time.After(60 * time.Second)
	for range recs {
		select {
		case d := <-deliveries:
			if m := d.(*kafka.Message); m.TopicPartition.Error != nil {
				tb.Fatalf("delivery: %v", m.TopicPartition.Error)
			}
		case <-timeout:
			tb.Fatal("deliveries did not arrive within 60s")
		}
	}
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

// count runs a one-number query; -1 when it fails (a table the engine has
// not created yet).
func count(pool *pgxpool.Pool, q string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int64
	if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
		return -1
	}
	return n
}

// waitApplied waits until the dashboard holds n events.
func waitApplied(tb testing.TB, pool *pgxpool.Pool, n int64) {
	tb.Helper()
	testenv.Eventually(tb, 90*time.Second, func() bool {
		return count(pool, `SELECT coalesce(sum(count), 0) FROM dashboard_rollups`) >= n
	}, "%d events applied", n)
}

// waitDeadLettered waits until the dead-letter topic holds n records.
func waitDeadLettered(tb testing.TB, c *kfake.Cluster, dlqTopic string, n int64) {
	tb.Helper()
	testenv.Eventually(tb, 90*time.Second, func() bool {
		var got int64
		for _, p := range c.PartitionInfos(dlqTopic) {
			got += p.HighWatermark
		}
		return got >= n
	}, "%d records in %s", n, dlqTopic)
}

// runUntil runs the engine until it returns or ctx is done. It returns
// the engine's error and whether ctx ended first (the engine was still
// running, and was stopped). An engine that does not return within a
// minute after ctx ends fails the test.
func runUntil(tb testing.TB, ctx context.Context, cfg config.Config, log testenv.Log) (err error, stopped bool) {
	tb.Helper()
	e := startEngine(tb, cfg, log)
	select {
	case <-e.Exited():
		return e.Wait(tb, 0), false
	case <-ctx.Done():
	}
	e.Cancel()
	return e.Wait(tb, 60*time.Second), true
}
