package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/hamba/avro/v2"

	"ratchet/config"
	"ratchet/internal/event"
	"ratchet/processor/dashboard"
)

// pipelinesReport is the configured-pipelines section (i, issue 25): the
// built-in dashboard against the same rollup declared as a pipeline, on
// the drains' backlog, and the rate of an upsert pipeline on JSON and on
// Avro values.
type pipelinesReport struct {
	events       int64
	rounds       []pipelinesRound
	upsertEvents int64
	json, avro   drainResult
}

type pipelinesRound struct {
	builtIn, piped drainResult
}

// Topics of the section, created with the broker.
var pipelineTopics = []string{"orders-json", "orders-json.dlq", "orders-avro", "orders-avro.dlq"}

// dashboardPipeline is examples/pipelines/dashboard.yaml.
func dashboardPipeline(topic string) []config.Pipeline {
	return []config.Pipeline{{Name: "dashboard", Topic: topic, Format: config.PipelineEvent,
		Rollup: &config.Rollup{Table: "dashboard_rollups", Time: "value.time", Bucket: time.Minute, BucketColumn: "bucket",
			GroupBy: []config.Column{{Name: "metric", Expr: "value.metric"}},
			Aggregates: []config.Column{{Name: "count", Expr: "count"}, {Name: "sum", Expr: "sum(value.value)"},
				{Name: "min", Expr: "min(value.value)"}, {Name: "max", Expr: "max(value.value)"}}}}}
}

// orderPipeline upserts the latest order per key from topic into table.
func orderPipeline(topic, format, table string) []config.Pipeline {
	return []config.Pipeline{{Name: "orders", Topic: topic, Format: format, Where: `value.status != "test"`,
		Upsert: &config.Upsert{Table: table, Key: []config.Column{{Name: "order_id", Expr: "string(record.key)"}},
			Columns: []config.Column{{Name: "customer", Expr: "value.customer.id"}, {Name: "amount", Expr: "double(value.amount)"},
				{Name: "updated_at", Expr: "record.timestamp"}}}}}
}

const orderAvroSchema = `{"type": "record", "name": "Order", "fields": [
  {"name": "status", "type": "string"},
  {"name": "amount", "type": "double"},
  {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
    {"name": "id", "type": "string"}, {"name": "country", "type": "string"}]}}]}`

type benchOrder struct {
	Status   string        `avro:"status" json:"status"`
	Amount   float64       `avro:"amount" json:"amount"`
	Customer benchCustomer `avro:"customer" json:"customer"`
}

type benchCustomer struct {
	ID      string `avro:"id" json:"id"`
	Country string `avro:"country" json:"country"`
}

// serveRegistry answers GET /schemas/ids/1 with orderAvroSchema, as a
// Confluent Schema Registry would; the engine asks nothing else.
func serveRegistry(ctx context.Context) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/schemas/ids/1") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
			return
		}
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		_ = json.NewEncoder(w).Encode(map[string]string{"schema": orderAvroSchema})
	})}
	go func() { _ = srv.Serve(ln) }()              // ends when the server is closed
	context.AfterFunc(ctx, func() { srv.Close() }) // the bench's end closes it
	return "http://" + ln.Addr().String(), nil
}

// preloadOrders writes n orders over 10,000 keys to topic, encoded by enc.
func preloadOrders(ctx context.Context, brokers []string, topic string, n int64, enc func(benchOrder) ([]byte, error)) error {
	return preloadOrdersAt(ctx, brokers, topic, n, func(_ int64, o benchOrder) ([]byte, error) { return enc(o) })
}

// preloadOrdersAt is preloadOrders with enc told each order's number.
func preloadOrdersAt(ctx context.Context, brokers []string, topic string, n int64, enc func(int64, benchOrder) ([]byte, error)) error {
	return produceN(ctx, brokers, topic, n, func(i int64) (int32, []byte, []byte, error) {
		o := benchOrder{Status: "new", Amount: float64(i%1000) / 4,
			Customer: benchCustomer{ID: fmt.Sprintf("c%d", i%777), Country: []string{"fr", "de", "es", "it"}[i%4]}}
		v, err := enc(i, o)
		return kafka.PartitionAny, fmt.Appendf(nil, "o%d", i%10_000), v, err
	})
}

// produceN writes the n records next makes (partition, key, value) to
// topic with an idempotent producer, and returns the first failed
// delivery's error, once every record was reported.
func produceN(ctx context.Context, brokers []string, topic string, n int64, next func(int64) (int32, []byte, []byte, error)) error {
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": strings.Join(brokers, ","), "linger.ms": 20,
		"enable.idempotence": true, "acks": "all", "log_level": 3})
	if err != nil {
		return err
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, 10_000)
	errs := make(chan error, 1)
	go func() { // ends after n delivery reports
		var first error
		for range n {
			if m := (<-deliveries).(*kafka.Message); m.TopicPartition.Error != nil && first == nil {
				first = m.TopicPartition.Error
			}
		}
		errs <- first
	}()
	t := topic
	for i := range n {
		part, key, v, err := next(i)
		if err != nil {
			return err
		}
		for {
			err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: part},
				Key: key, Value: v}, deliveries)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p.Flush(50)
		}
	}
	return <-errs
}

// runPipelines measures the section: rounds interleaved drains of the
// events backlog (n events) by the built-in dashboard and by the same
// rollup as a pipeline, each checked by sum(count); then one drain of an
// upsert pipeline on m JSON orders and one on m Avro orders.
func runPipelines(ctx context.Context, env *benchEnv, n, m int64, rounds int, say func(string, ...any)) (*pipelinesReport, error) {
	rep := &pipelinesReport{events: n, upsertEvents: m}
	drain := func(r int, piped bool) (drainResult, error) {
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return drainResult{}, err
		}
		name, proc, tweak := "built-in", dashboard.New(), func(*config.Config) {}
		if piped {
			name, proc, tweak = "pipeline", nil, func(c *config.Config) { c.Pipelines = dashboardPipeline("events") }
		}
		d, err := drainRatchet(ctx, env, "events", fmt.Sprintf("bench-j-%s-%d", name, r), config.ModeExactlyOnce, proc, n, "", tweak)
		if err != nil {
			return drainResult{}, fmt.Errorf("round %d (j) %s: %w", r, name, err)
		}
		if got, err := rollupCount(ctx, env); err != nil || got != n {
			return drainResult{}, fmt.Errorf("round %d (j) %s: sum(count) in dashboard_rollups is %d, want %d (%v)", r, name, got, n, err)
		}
		say("round %d (j) exactly-once dashboard, %-9s %9.0f events/s (wall %s), %s", r, name+":", d.Rate(), d.Wall.Round(time.Millisecond), d.cpuLine())
		return d, nil
	}
	for r := 1; r <= rounds; r++ {
		var x pipelinesRound
		var err error
		if r%2 == 1 {
			if x.builtIn, err = drain(r, false); err == nil {
				x.piped, err = drain(r, true)
			}
		} else {
			if x.piped, err = drain(r, true); err == nil {
				x.builtIn, err = drain(r, false)
			}
		}
		if err != nil {
			return nil, err
		}
		rep.rounds = append(rep.rounds, x)
	}

	regURL, err := serveRegistry(ctx)
	if err != nil {
		return nil, err
	}
	schema, err := avro.Parse(orderAvroSchema)
	if err != nil {
		return nil, err
	}
	encode := map[string]func(benchOrder) ([]byte, error){
		"json": func(o benchOrder) ([]byte, error) { return json.Marshal(o) },
		"avro": func(o benchOrder) ([]byte, error) {
			b, err := avro.Marshal(schema, o)
			return append(event.AppendFrame(nil, 1, nil), b...), err
		},
	}
	for _, format := range []string{"json", "avro"} {
		topic, table := "orders-"+format, "bench_orders_"+format
		if _, err := env.db.pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+table+
			" (order_id text PRIMARY KEY, customer text, amount double precision, updated_at timestamptz)"); err != nil {
			return nil, err
		}
		start := time.Now()
		if err := preloadOrders(ctx, env.brokers, topic, m, encode[format]); err != nil {
			return nil, fmt.Errorf("preload %s: %w", topic, err)
		}
		say("preloaded %d %s orders to %s in %s", m, format, topic, time.Since(start).Round(time.Millisecond))
		d, err := drainRatchet(ctx, env, topic, "bench-j-upsert-"+format, config.ModeExactlyOnce, nil, m, "", func(c *config.Config) {
			c.Pipelines = orderPipeline(topic, format, table)
			if format == "avro" {
				c.SchemaRegistry.URL = config.SecretURL(regURL)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("(j) upsert %s: %w", format, err)
		}
		var rows int64
		if err := env.db.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil || rows != min(m, 10_000) {
			return nil, fmt.Errorf("(j) upsert %s: %d rows in %s, want %d (%v)", format, rows, table, min(m, 10_000), err)
		}
		say("(j) exactly-once upsert pipeline, %s: %9.0f records/s (wall %s), %s", format, d.Rate(), d.Wall.Round(time.Millisecond), d.cpuLine())
		if format == "json" {
			rep.json = d
		} else {
			rep.avro = d
		}
	}
	return rep, nil
}

// rows adds the section's rows to the results table.
func (s *pipelinesReport) rows(row func(cells ...string)) {
	if s == nil || len(s.rounds) == 0 {
		return
	}
	series := func(f func(pipelinesRound) float64, format string) (string, float64) {
		var xs []float64
		var parts []string
		for _, r := range s.rounds {
			v := f(r)
			xs = append(xs, v)
			parts = append(parts, fmt.Sprintf(format, v))
		}
		return strings.Join(parts, ", "), median(xs)
	}
	rs, v := series(func(r pipelinesRound) float64 { return r.builtIn.Rate() }, "%.0f")
	row(fmt.Sprintf("(j) exactly-once, built-in dashboard, %d events", s.events), fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r pipelinesRound) float64 { return r.piped.Rate() }, "%.0f")
	row("(j) the same rollup as a configured pipeline (examples/pipelines/dashboard.yaml)", fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r pipelinesRound) float64 { return r.piped.Rate() / r.builtIn.Rate() }, "%.2f")
	row("(j) pipeline / built-in", fmt.Sprintf("%.2f (rounds: %s)", v, rs), "≥ 0.8", passMiss(v >= 0.8))
	row(fmt.Sprintf("(j) exactly-once upsert pipeline, %d JSON orders over 10,000 keys", s.upsertEvents), fmt.Sprintf("%.0f records/s", s.json.Rate()), "", "")
	row(fmt.Sprintf("(j) exactly-once upsert pipeline, %d Avro orders (registry wire format) over 10,000 keys", s.upsertEvents), fmt.Sprintf("%.0f records/s", s.avro.Rate()), "", "")
}

// method says how the section is measured.
func (s *pipelinesReport) method() string {
	if s == nil || len(s.rounds) == 0 {
		return ""
	}
	return fmt.Sprintf("- Pipelines (j): %d rounds, each draining the same %d-event backlog twice with the in-process engine (exactly-once, fresh group): once with the built-in dashboard and once with the same rollup declared as a pipeline (examples/pipelines/dashboard.yaml), the order alternating between rounds; `sum(count)` checked after each. Then one drain each of an upsert pipeline (`where`, a key from `record.key`, three columns) on %d JSON orders and on %d Avro orders in the registry's wire format (a stub registry answering the one schema id), the row count checked. CEL cost per record: `go test ./processor/pipeline -bench Collect -benchmem`.\n",
		len(s.rounds), s.events, s.upsertEvents, s.upsertEvents)
}
