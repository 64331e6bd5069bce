package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/valyala/fastjson"
	"google.golang.org/protobuf/encoding/protowire"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/event"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/store"
)

// pgRateReport is section (l) (issue 33): pipelines against what
// PostgreSQL alone and a bare Poll loop take for the same records. For an
// upsert of JSON, Avro and Protobuf orders, ratchet's exactly-once drain
// against a direct pgx loop writing the same rows with the same
// connections and rows per transaction; for a rollup of the JSON and Avro
// orders, the drain against a Poll loop decoding the same fields with the
// fastest decoder at hand. Each with CPU-seconds per 100,000 records of
// ratchet and of PostgreSQL.
type pgRateReport struct {
	records int64
	perTx   int
	conns   int
	rounds  []pgRateRound
	// txRates are the direct JSON upsert loop's rates at other rows per
	// transaction (-pg-rate-tx), in the order given.
	txSizes []int
	txRates []float64
	// pinned: PostgreSQL ran on CPU 0 only, the bench process and the
	// broker on the others (pin.go); skipped says why it could not be.
	pinned  bool
	skipped string
}

// pgRateRound is one round: per format, the pipeline's drain and its
// baseline, upserts and rollups.
type pgRateRound struct {
	upsert, rollup map[string]pgRatePair
}

type pgRatePair struct{ ratchet, base pgRun }

// pgRun is one timed run with the CPU of PostgreSQL's server processes.
type pgRun struct {
	drainResult
	pgCPU    float64 // seconds of CPU (user + system) of the bench database's backends during the run
	pgServer float64 // the same of the whole server (every database, auxiliary processes included)
}

// measurePG starts following PostgreSQL's CPU time; the function it
// returns ends it and gives the bench database's backends' seconds and the
// whole server's.
func measurePG(env *benchEnv) func() (db, server float64) {
	pg0, s := postgresTicks(), startPGBackendSampler(env.db.name, 250*time.Millisecond)
	return func() (float64, float64) {
		db := s.end()
		return db, ticksToSeconds(postgresTicks() - pg0)
	}
}

// pgServerPer100k is the whole server's CPU-seconds per 100,000 records.
func (r pgRun) pgServerPer100k() float64 {
	if r.Events <= 0 {
		return 0
	}
	return r.pgServer / float64(r.Events) * 1e5
}

// ratchetPer100k is the CPU-seconds of this process (the in-process engine
// or the loop, librdkafka's threads included) per 100,000 records.
func (r pgRun) ratchetPer100k() float64 {
	if r.Events <= 0 {
		return 0
	}
	return r.CPU.self * r.Steady.Seconds() / float64(r.Events) * 1e5
}

// brokerPer100k is the broker's CPU-seconds per 100,000 records.
func (r pgRun) brokerPer100k() float64 {
	if r.Events <= 0 {
		return 0
	}
	return r.CPU.broker * r.Steady.Seconds() / float64(r.Events) * 1e5
}

// cpuBudget is the CPU-seconds per 100,000 records that a pipeline may
// take and still reach 0.8 of its baseline's rate (the direct loop's for
// an upsert, the Poll loop's for a rollup) on cpus cores kept busy: the
// cores' time at that rate, less what PostgreSQL and the broker took per
// record in the pipeline's own run.
func cpuBudget(cpus int, pipeline, baseline pgRun) float64 {
	if baseline.Rate() <= 0 {
		return 0
	}
	return float64(cpus)*1e5/(0.8*baseline.Rate()) - pipeline.pgPer100k() - pipeline.brokerPer100k()
}

// pgPer100k is the CPU-seconds of PostgreSQL per 100,000 records.
func (r pgRun) pgPer100k() float64 {
	if r.Events <= 0 {
		return 0
	}
	return r.pgCPU / float64(r.Events) * 1e5
}

var (
	pgRateUpsertFormats = []string{"json", "avro", "protobuf"}
	pgRateRollupFormats = []string{"json", "avro"}
)

const pgRatePartitions = 12

// pgRateTopics are the section's topics, created with the broker.
var pgRateTopics = []string{"pg-orders-json", "pg-orders-json.dlq", "pg-orders-avro", "pg-orders-avro.dlq",
	"pg-orders-protobuf", "pg-orders-protobuf.dlq"}

// pgOrder is the section's document: ten fields, two of them nested
// objects. The pipelines read five of them (one nested).
type pgOrder struct {
	ID        string     `avro:"id" json:"id"`
	Status    string     `avro:"status" json:"status"`
	Amount    float64    `avro:"amount" json:"amount"`
	Currency  string     `avro:"currency" json:"currency"`
	Customer  pgCustomer `avro:"customer" json:"customer"`
	Shipping  pgShipping `avro:"shipping" json:"shipping"`
	Items     int64      `avro:"items" json:"items"`
	CreatedAt string     `avro:"created_at" json:"created_at"`
	Tags      []string   `avro:"tags" json:"tags"`
	Channel   string     `avro:"channel" json:"channel"`
}

type pgCustomer struct {
	ID      string `avro:"id" json:"id"`
	Country string `avro:"country" json:"country"`
	Tier    string `avro:"tier" json:"tier"`
}

type pgShipping struct {
	City string `avro:"city" json:"city"`
	Zip  string `avro:"zip" json:"zip"`
}

const pgOrderAvroSchema = `{"type": "record", "name": "Order", "namespace": "bench.v1", "fields": [
  {"name": "id", "type": "string"},
  {"name": "status", "type": "string"},
  {"name": "amount", "type": "double"},
  {"name": "currency", "type": "string"},
  {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
    {"name": "id", "type": "string"}, {"name": "country", "type": "string"}, {"name": "tier", "type": "string"}]}},
  {"name": "shipping", "type": {"type": "record", "name": "Shipping", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": "string"}]}},
  {"name": "items", "type": "long"},
  {"name": "created_at", "type": "string"},
  {"name": "tags", "type": {"type": "array", "items": "string"}},
  {"name": "channel", "type": "string"}]}`

const pgOrderProtoSchema = `syntax = "proto3";
package bench.v1;
message Order {
  message Customer { string id = 1; string country = 2; string tier = 3; }
  message Shipping { string city = 1; string zip = 2; }
  string id = 1;
  string status = 2;
  double amount = 3;
  string currency = 4;
  Customer customer = 5;
  Shipping shipping = 6;
  int64 items = 7;
  string created_at = 8;
  repeated string tags = 9;
  string channel = 10;
}
`

// Schema ids the section's stub registry answers.
const (
	pgAvroSchemaID  = 21
	pgProtoSchemaID = 22
)

// makeOrder is the i-th order of the section; the same i gives the same
// order in every format.
func makeOrder(i int64) pgOrder {
	return pgOrder{
		ID:       fmt.Sprintf("o%d", i),
		Status:   []string{"new", "paid", "shipped", "delivered", "cancelled"}[i%5],
		Amount:   float64(i%10_000) / 4,
		Currency: []string{"EUR", "USD", "GBP"}[i%3],
		Customer: pgCustomer{ID: fmt.Sprintf("c%d", i%7777), Country: []string{"fr", "de", "es", "it", "nl", "pl"}[i%6],
			Tier: []string{"gold", "silver", "bronze"}[i%3]},
		Shipping:  pgShipping{City: []string{"Paris", "Berlin", "Madrid", "Rome"}[i%4], Zip: fmt.Sprintf("%05d", i%99_999)},
		Items:     1 + i%9,
		CreatedAt: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second).Format(time.RFC3339),
		Tags:      []string{"web", []string{"promo", "gift", "repeat"}[i%3]},
		Channel:   []string{"web", "app", "store"}[i%3],
	}
}

// appendProtoOrder appends o in the protobuf wire format of
// pgOrderProtoSchema's Order to b.
func appendProtoOrder(b []byte, o pgOrder) []byte {
	str := func(b []byte, n protowire.Number, s string) []byte {
		b = protowire.AppendTag(b, n, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	b = str(b, 1, o.ID)
	b = str(b, 2, o.Status)
	b = protowire.AppendTag(b, 3, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(o.Amount))
	b = str(b, 4, o.Currency)
	var c []byte
	c = str(c, 1, o.Customer.ID)
	c = str(c, 2, o.Customer.Country)
	c = str(c, 3, o.Customer.Tier)
	b = protowire.AppendTag(b, 5, protowire.BytesType)
	b = protowire.AppendBytes(b, c)
	var s []byte
	s = str(s, 1, o.Shipping.City)
	s = str(s, 2, o.Shipping.Zip)
	b = protowire.AppendTag(b, 6, protowire.BytesType)
	b = protowire.AppendBytes(b, s)
	b = protowire.AppendTag(b, 7, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(o.Items))
	b = str(b, 8, o.CreatedAt)
	for _, t := range o.Tags {
		b = str(b, 9, t)
	}
	return str(b, 10, o.Channel)
}

// serveSchemas answers GET /schemas/ids/N for the schemas given, as a
// Confluent Schema Registry would.
func serveSchemas(ctx context.Context, schemas map[int]map[string]string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/schemas/ids/")
		id, err := strconv.Atoi(strings.SplitN(rest, "/", 2)[0])
		s, known := schemas[id]
		if !ok || err != nil || !known {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
			return
		}
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		_ = json.NewEncoder(w).Encode(s)
	})}
	go func() { _ = srv.Serve(ln) }()              // ends when the server is closed
	context.AfterFunc(ctx, func() { srv.Close() }) // the bench's end closes it
	return "http://" + ln.Addr().String(), nil
}

// preloadPGOrders writes orders 0..n-1 to topic, order i to partition
// i % 12 with key "o<i>", encoded by enc.
func preloadPGOrders(ctx context.Context, brokers []string, topic string, n int64, enc func([]byte, pgOrder) ([]byte, error)) error {
	return produceN(ctx, brokers, topic, n, func(i int64) (int32, []byte, []byte, error) {
		o := makeOrder(i)
		v, err := enc(nil, o)
		return int32(i % pgRatePartitions), []byte(o.ID), v, err
	})
}

// pgRateColumns are the upsert table's columns, the key first.
var pgRateColumns = []string{"order_id", "status", "amount", "customer", "items"}

// pgRateUpsert is the upsert pipeline: the key and four columns, one of
// them nested, of the ten fields.
func pgRateUpsert(topic, format, table string) []config.Pipeline {
	return []config.Pipeline{{Name: "orders_pg", Topic: topic, Format: format,
		Upsert: &config.Upsert{Table: table, Key: []config.Column{{Name: "order_id", Expr: "value.id"}},
			Columns: []config.Column{{Name: "status", Expr: "value.status"}, {Name: "amount", Expr: "value.amount"},
				{Name: "customer", Expr: "value.customer.id"}, {Name: "items", Expr: "int(value.items)"}}}}}
}

// pgRateRollup counts the orders and sums their amounts per status and
// minute of the record's timestamp.
func pgRateRollup(topic, format, table string) []config.Pipeline {
	return []config.Pipeline{{Name: "orders_by_status", Topic: topic, Format: format,
		Rollup: &config.Rollup{Table: table, Time: "record.timestamp", Bucket: time.Minute, BucketColumn: "bucket",
			GroupBy:    []config.Column{{Name: "status", Expr: "value.status"}},
			Aggregates: []config.Column{{Name: "count", Expr: "count"}, {Name: "amount", Expr: "sum(value.amount)"}}}}}
}

const pgRateUpsertSQL = `INSERT INTO %[1]s (order_id, status, amount, customer, items)
	SELECT * FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[], $5::bigint[])
	ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status, amount = EXCLUDED.amount,
		customer = EXCLUDED.customer, items = EXCLUDED.items`

// pgRateRows are one partition's decoded rows, column by column.
type pgRateRows struct {
	ids, status, customer []string
	amount                []float64
	items                 []int64
}

// runPGRate measures the section on n records of each format.
func runPGRate(ctx context.Context, env *benchEnv, n int64, rounds int, txSizes []int, profile, pinned bool, say func(string, ...any)) (*pgRateReport, []string, error) {
	if pinned {
		p, err := pinSection(env, "(l)", say)
		if err != nil {
			return nil, nil, err
		}
		defer p.undo()
	}
	avroSchema, err := avro.Parse(pgOrderAvroSchema)
	if err != nil {
		return nil, nil, err
	}
	regURL, err := serveSchemas(ctx, map[int]map[string]string{
		pgAvroSchemaID:  {"schema": pgOrderAvroSchema, "schemaType": "AVRO"},
		pgProtoSchemaID: {"schema": pgOrderProtoSchema, "schemaType": "PROTOBUF"},
	})
	if err != nil {
		return nil, nil, err
	}
	encode := map[string]func([]byte, pgOrder) ([]byte, error){
		"json": func(b []byte, o pgOrder) ([]byte, error) {
			v, err := json.Marshal(o)
			return append(b, v...), err
		},
		"avro": func(b []byte, o pgOrder) ([]byte, error) {
			v, err := avro.Marshal(avroSchema, o)
			return append(event.AppendFrame(b, pgAvroSchemaID, nil), v...), err
		},
		"protobuf": func(b []byte, o pgOrder) ([]byte, error) {
			return appendProtoOrder(event.AppendFrame(b, pgProtoSchemaID, []int{0}), o), nil
		},
	}
	for _, f := range pgRateUpsertFormats {
		if pinned {
			break // the unpinned run, always first, loaded the topics and made the tables
		}
		start := time.Now()
		if err := preloadPGOrders(ctx, env.brokers, "pg-orders-"+f, n, encode[f]); err != nil {
			return nil, nil, fmt.Errorf("preload pg-orders-%s: %w", f, err)
		}
		say("preloaded %d %s orders to pg-orders-%s in %s", n, f, f, time.Since(start).Round(time.Millisecond))
		for _, ddl := range []string{
			"CREATE TABLE IF NOT EXISTS bench_pg_upsert_" + f + " (order_id text PRIMARY KEY, status text, amount double precision, customer text, items bigint)",
			"CREATE TABLE IF NOT EXISTS bench_pg_rollup_" + f + " (status text NOT NULL, bucket timestamptz NOT NULL, count bigint NOT NULL, amount double precision NOT NULL, PRIMARY KEY (status, bucket))",
		} {
			if _, err := env.db.pool.Exec(ctx, ddl); err != nil {
				return nil, nil, err
			}
		}
	}
	cfg := env.config(env.brokers, "pg-orders-json", "bench-l", config.ModeExactlyOnce)
	rep := &pgRateReport{records: n, perTx: cfg.Processing.BatchSize, conns: engine.DefaultPoolSize(pgRatePartitions), pinned: pinned}
	withRegistry := func(c *config.Config) { c.SchemaRegistry.URL = config.SecretURL(regURL) }

	var rows map[int32]*pgRateRows // read back after the first JSON upsert drain
	var fingerprint string         // of the rows every upsert run must leave
	upsertDrain := func(r int, f string, prof string) (pgRun, error) {
		table := "bench_pg_upsert_" + f
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE "+table); err != nil {
			return pgRun{}, err
		}
		if err := env.checkpoint(ctx); err != nil {
			return pgRun{}, err
		}
		pg := measurePG(env)
		d, err := drainRatchet(ctx, env, "pg-orders-"+f, fmt.Sprintf("bench-l-upsert-%s-%d-%d", f, r, time.Now().UnixNano()), config.ModeExactlyOnce, nil, n, prof,
			withRegistry, func(c *config.Config) { c.Pipelines = pgRateUpsert("pg-orders-"+f, f, table) })
		run := pgRun{drainResult: d}
		run.pgCPU, run.pgServer = pg()
		if err != nil {
			return pgRun{}, fmt.Errorf("round %d (l) %s upsert pipeline: %w", r, f, err)
		}
		if err := checkPGRateRows(ctx, env, table, n, &fingerprint); err != nil {
			return pgRun{}, fmt.Errorf("round %d (l) %s upsert pipeline: %w", r, f, err)
		}
		if rows == nil {
			if rows, err = readPGRateRows(ctx, env, table); err != nil {
				return pgRun{}, err
			}
		}
		say("round %d (l) exactly-once %-8s upsert pipeline: %9.0f records/s (wall %s), %s; CPU-s per 100k: ratchet %.2f, PostgreSQL %.2f (server-wide %.2f)",
			r, f, run.Rate(), run.Wall.Round(time.Millisecond), run.cpuLine(), run.ratchetPer100k(), run.pgPer100k(), run.pgServerPer100k())
		return run, nil
	}
	direct := func(r int, f string, perTx int) (pgRun, error) {
		table := "bench_pg_upsert_" + f
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE "+table); err != nil {
			return pgRun{}, err
		}
		if err := env.checkpoint(ctx); err != nil {
			return pgRun{}, err
		}
		run, err := directUpsert(ctx, env, cfg.Postgres.URL.Reveal(), rep.conns, perTx, table, rows, n)
		if err != nil {
			return pgRun{}, fmt.Errorf("round %d (l) %s direct upsert: %w", r, f, err)
		}
		if err := checkPGRateRows(ctx, env, table, n, &fingerprint); err != nil {
			return pgRun{}, fmt.Errorf("round %d (l) %s direct upsert: %w", r, f, err)
		}
		say("round %d (l) direct pgx upsert loop (%s rows, %d rows/tx): %9.0f records/s, CPU-s per 100k: loop %.2f, PostgreSQL %.2f (server-wide %.2f)",
			r, f, perTx, run.Rate(), run.ratchetPer100k(), run.pgPer100k(), run.pgServerPer100k())
		return run, nil
	}
	rollupDrain := func(r int, f string, prof string) (pgRun, error) {
		table := "bench_pg_rollup_" + f
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE "+table); err != nil {
			return pgRun{}, err
		}
		if err := env.checkpoint(ctx); err != nil {
			return pgRun{}, err
		}
		pg := measurePG(env)
		d, err := drainRatchet(ctx, env, "pg-orders-"+f, fmt.Sprintf("bench-l-rollup-%s-%d-%d", f, r, time.Now().UnixNano()), config.ModeExactlyOnce, nil, n, prof,
			withRegistry, func(c *config.Config) { c.Pipelines = pgRateRollup("pg-orders-"+f, f, table) })
		run := pgRun{drainResult: d}
		run.pgCPU, run.pgServer = pg()
		if err != nil {
			return pgRun{}, fmt.Errorf("round %d (l) %s rollup pipeline: %w", r, f, err)
		}
		var got int64
		if err := env.db.pool.QueryRow(ctx, "SELECT coalesce(sum(count), 0)::bigint FROM "+table).Scan(&got); err != nil || got != n {
			return pgRun{}, fmt.Errorf("round %d (l) %s rollup pipeline: sum(count) is %d, want %d (%v)", r, f, got, n, err)
		}
		say("round %d (l) exactly-once %-8s rollup pipeline: %9.0f records/s (wall %s), %s; CPU-s per 100k: ratchet %.2f, PostgreSQL %.2f (server-wide %.2f)",
			r, f, run.Rate(), run.Wall.Round(time.Millisecond), run.cpuLine(), run.ratchetPer100k(), run.pgPer100k(), run.pgServerPer100k())
		return run, nil
	}
	poll := func(r int, f string) (pgRun, error) {
		d, err := pollDecode(ctx, env, "pg-orders-"+f, f, avroSchema, n)
		if err != nil {
			return pgRun{}, fmt.Errorf("round %d (l) %s Poll loop: %w", r, f, err)
		}
		run := pgRun{drainResult: d}
		say("round %d (l) bare Poll loop + %-8s decode: %9.0f records/s (wall %s), %s; CPU-s per 100k: %.2f",
			r, f, run.Rate(), run.Wall.Round(time.Millisecond), run.cpuLine(), run.ratchetPer100k())
		return run, nil
	}

	for r := 1; r <= rounds; r++ {
		x := pgRateRound{upsert: map[string]pgRatePair{}, rollup: map[string]pgRatePair{}}
		// The pipeline goes first in odd rounds, the baseline in even ones;
		// round 1 drains first, so that the direct loop has its rows.
		for _, f := range pgRateUpsertFormats {
			var p pgRatePair
			var err error
			if r%2 == 1 {
				if p.ratchet, err = upsertDrain(r, f, ""); err == nil {
					p.base, err = direct(r, f, rep.perTx)
				}
			} else {
				if p.base, err = direct(r, f, rep.perTx); err == nil {
					p.ratchet, err = upsertDrain(r, f, "")
				}
			}
			if err != nil {
				return nil, nil, err
			}
			x.upsert[f] = p
		}
		for _, f := range pgRateRollupFormats {
			var p pgRatePair
			var err error
			if r%2 == 1 {
				if p.ratchet, err = rollupDrain(r, f, ""); err == nil {
					p.base, err = poll(r, f)
				}
			} else {
				if p.base, err = poll(r, f); err == nil {
					p.ratchet, err = rollupDrain(r, f, "")
				}
			}
			if err != nil {
				return nil, nil, err
			}
			x.rollup[f] = p
		}
		rep.rounds = append(rep.rounds, x)
	}
	// The runs after the rounds (other rows per transaction, profiles) are
	// logged as round 0.
	for _, size := range txSizes {
		run, err := direct(0, "json", size)
		if err != nil {
			return nil, nil, err
		}
		rep.txSizes = append(rep.txSizes, size)
		rep.txRates = append(rep.txRates, run.Rate())
	}
	var profiles []string
	for _, f := range pgRateUpsertFormats {
		ratio := rep.median(func(x pgRateRound) float64 { return x.upsert[f].ratchet.Rate() / x.upsert[f].base.Rate() })
		if !profile && ratio >= 0.8 {
			continue
		}
		p := env.outPath("cpu-pg-rate-" + f + "-upsert.pprof")
		if _, err := upsertDrain(0, f, p); err != nil {
			return nil, nil, err
		}
		profiles = append(profiles, profileTop("(l) exactly-once "+f+" upsert pipeline", p))
		say("profiled (l) %s upsert: %s", f, p)
	}
	for _, f := range pgRateRollupFormats {
		ratio := rep.median(func(x pgRateRound) float64 { return x.rollup[f].ratchet.Rate() / x.rollup[f].base.Rate() })
		if !profile && ratio >= 0.8 {
			continue
		}
		p := env.outPath("cpu-pg-rate-" + f + "-rollup.pprof")
		if _, err := rollupDrain(0, f, p); err != nil {
			return nil, nil, err
		}
		profiles = append(profiles, profileTop("(l) exactly-once "+f+" rollup pipeline", p))
		say("profiled (l) %s rollup: %s", f, p)
	}
	return rep, profiles, nil
}

// checkPGRateRows checks that table holds one row per order, and the same
// rows as every table checked before it (the first upsert drain's rows are
// checked against the orders produced when they are read back).
func checkPGRateRows(ctx context.Context, env *benchEnv, table string, n int64, want *string) error {
	var got int64
	var sum string
	if err := env.db.pool.QueryRow(ctx, "SELECT count(*), coalesce(md5(string_agg(concat_ws('|', "+strings.Join(pgRateColumns, ", ")+
		"), ',' ORDER BY order_id)), '') FROM "+table).Scan(&got, &sum); err != nil || got != n {
		return fmt.Errorf("%d rows in %s, want %d (%v)", got, table, n, err)
	}
	if *want == "" {
		*want = sum
	} else if sum != *want {
		return fmt.Errorf("the rows in %s differ from those the first drain wrote (md5 %s, want %s)", table, sum, *want)
	}
	return nil
}

// readPGRateRows reads the upserted rows back, by the partition their
// order was produced to (order i to partition i % 12) and in offset order.
func readPGRateRows(ctx context.Context, env *benchEnv, table string) (map[int32]*pgRateRows, error) {
	rs, err := env.db.pool.Query(ctx, "SELECT "+strings.Join(pgRateColumns, ", ")+" FROM "+table+" ORDER BY substr(order_id, 2)::bigint")
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	out := map[int32]*pgRateRows{}
	for rs.Next() {
		var id, status, customer string
		var amount float64
		var items int64
		if err := rs.Scan(&id, &status, &amount, &customer, &items); err != nil {
			return nil, err
		}
		i, err := strconv.ParseInt(strings.TrimPrefix(id, "o"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("order id %q: %w", id, err)
		}
		if o := makeOrder(i); o.Status != status || o.Amount != amount || o.Customer.ID != customer || o.Items != items {
			return nil, fmt.Errorf("%s: row %s is (%s, %v, %s, %d), the order it was produced from (%s, %v, %s, %d)", table, id,
				status, amount, customer, items, o.Status, o.Amount, o.Customer.ID, o.Items)
		}
		p := int32(i % pgRatePartitions)
		if out[p] == nil {
			out[p] = &pgRateRows{}
		}
		x := out[p]
		x.ids, x.status, x.amount, x.customer, x.items = append(x.ids, id), append(x.status, status), append(x.amount, amount),
			append(x.customer, customer), append(x.items, items)
	}
	return out, rs.Err()
}

// directUpsert writes rows with one writer per partition on a pool of
// conns connections, perTx rows per transaction.
func directUpsert(ctx context.Context, env *benchEnv, url string, conns, perTx int, table string, rows map[int32]*pgRateRows, n int64) (pgRun, error) {
	pool, err := store.Open(ctx, url, int32(conns))
	if err != nil {
		return pgRun{}, err
	}
	defer pool.Close()
	sql := fmt.Sprintf(pgRateUpsertSQL, table)
	pg, cpu0 := measurePG(env), sampleCPU(env.brokerPID)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(rows))
	for _, x := range rows { // one writer per partition, as the engine's
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < len(x.ids); i += perTx {
				j := min(i+perTx, len(x.ids))
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, sql, x.ids[i:j], x.status[i:j], x.amount[i:j], x.customer[i:j], x.items[i:j])
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	end := time.Now()
	cpu := sampleCPU(env.brokerPID).since(cpu0)
	run := pgRun{drainResult: drainResult{Events: n, Wall: end.Sub(start), Steady: end.Sub(start), CPU: cpu}}
	run.pgCPU, run.pgServer = pg()
	close(errs)
	if err := <-errs; err != nil {
		return pgRun{}, err
	}
	return run, nil
}

// pollDecode reads topic with a bare Poll loop (ratchet's consumer
// settings, every partition assigned from the start, no group commits) and
// decodes in each record the fields the rollup reads (status and amount),
// summing amounts per status, with the fastest decoder at hand for the
// format: valyala/fastjson for JSON, hamba/avro into a struct for Avro.
func pollDecode(ctx context.Context, env *benchEnv, topic, format string, schema avro.Schema, n int64) (drainResult, error) {
	m := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Brokers: env.brokers, GroupID: "bench-l-poll"})
	_ = m.SetKey("go.logs.channel.enable", false)
	_ = m.SetKey("log_level", 3)
	c, err := kafka.NewConsumer(m)
	if err != nil {
		return drainResult{}, fmt.Errorf("consumer: %w", err)
	}
	defer c.Close()
	start := time.Now()
	t := topic
	var tps []kafka.TopicPartition
	for p := range int32(pgRatePartitions) {
		tps = append(tps, kafka.TopicPartition{Topic: &t, Partition: p, Offset: kafka.OffsetBeginning})
	}
	if err := c.Assign(tps); err != nil {
		return drainResult{}, fmt.Errorf("assign: %w", err)
	}
	var parser fastjson.Parser
	var order struct {
		Status string  `avro:"status"`
		Amount float64 `avro:"amount"`
	}
	sums := map[string]float64{}
	var got, bad int64
	var first time.Time
	var cpu0 cpuSample
	deadline := time.Now().Add(10 * time.Minute)
	for got < n {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return drainResult{}, fmt.Errorf("%d of %d after %s", got, n, time.Since(start))
		}
		switch ev := c.Poll(100).(type) {
		case *kafka.Message:
			if got == 0 {
				first, cpu0 = time.Now(), sampleCPU(env.brokerPID)
			}
			got++
			switch format {
			case "json":
				v, err := parser.ParseBytes(ev.Value)
				if err != nil {
					bad++
					continue
				}
				sums[string(v.GetStringBytes("status"))] += v.GetFloat64("amount")
			case "avro":
				if len(ev.Value) < 5 || avro.Unmarshal(schema, ev.Value[5:], &order) != nil {
					bad++
					continue
				}
				sums[order.Status] += order.Amount
			}
		case kafka.Error:
			if ev.IsFatal() {
				return drainResult{}, ev
			}
		}
	}
	end, cpu := time.Now(), sampleCPU(env.brokerPID).since(cpu0)
	if bad > 0 || len(sums) == 0 {
		return drainResult{}, fmt.Errorf("%d of %d records did not decode", bad, got)
	}
	return drainResult{Events: got, Wall: end.Sub(start), Steady: end.Sub(first), CPU: cpu}, nil
}

// median is the median over the rounds of f.
func (s *pgRateReport) median(f func(pgRateRound) float64) float64 {
	var xs []float64
	for _, r := range s.rounds {
		xs = append(xs, f(r))
	}
	return median(xs)
}

// series is f of each round, formatted, and their median.
func (s *pgRateReport) series(f func(pgRateRound) float64, format string) (string, float64) {
	var parts []string
	for _, r := range s.rounds {
		parts = append(parts, fmt.Sprintf(format, f(r)))
	}
	return strings.Join(parts, ", "), s.median(f)
}

// rows adds the section's rows to the results table.
func (s *pgRateReport) rows(row func(cells ...string)) {
	if s != nil && s.skipped != "" {
		row("(l) pinned", "skipped: "+s.skipped, "", "")
		return
	}
	if s == nil || len(s.rounds) == 0 {
		return
	}
	names := map[string]string{"json": "JSON", "avro": "Avro", "protobuf": "Protobuf"}
	l := "(l)"
	if s.pinned {
		l = "(l, PostgreSQL pinned to CPU 0, the rest to the others)"
	}
	cpuCell := func(get func(pgRateRound) pgRun, pg bool) string {
		rs, v := s.series(func(x pgRateRound) float64 { return get(x).ratchetPer100k() }, "%.2f")
		cell := fmt.Sprintf("CPU-s per 100k: %.2f (rounds: %s)", v, rs)
		if pg {
			rs, v = s.series(func(x pgRateRound) float64 { return get(x).pgPer100k() }, "%.2f")
			cell += fmt.Sprintf("; PostgreSQL %.2f (rounds: %s)", v, rs)
		}
		return cell
	}
	for _, f := range pgRateUpsertFormats {
		rat := func(x pgRateRound) pgRun { return x.upsert[f].ratchet }
		base := func(x pgRateRound) pgRun { return x.upsert[f].base }
		rs, v := s.series(func(x pgRateRound) float64 { return rat(x).Rate() }, "%.0f")
		row(fmt.Sprintf(l+" exactly-once upsert pipeline, %d %s orders (10 fields, key + 4 read), distinct keys", s.records, names[f]),
			fmt.Sprintf("%.0f records/s (rounds: %s); ratchet %s", v, rs, cpuCell(rat, true)), "", "")
		rs, v = s.series(func(x pgRateRound) float64 { return base(x).Rate() }, "%.0f")
		row(fmt.Sprintf(l+" direct pgx upsert loop (unnest … ON CONFLICT), the same rows, %d writers, pool %d, %d rows/tx", pgRatePartitions, s.conns, s.perTx),
			fmt.Sprintf("%.0f records/s (rounds: %s); loop %s", v, rs, cpuCell(base, true)), "", "")
		rs, v = s.series(func(x pgRateRound) float64 { return rat(x).Rate() / base(x).Rate() }, "%.2f")
		row(fmt.Sprintf(l+" %s upsert pipeline / direct pgx loop", names[f]), fmt.Sprintf("%.2f (rounds: %s)", v, rs), "≥ 0.8", passMiss(v >= 0.8))
	}
	for _, f := range pgRateRollupFormats {
		rat := func(x pgRateRound) pgRun { return x.rollup[f].ratchet }
		base := func(x pgRateRound) pgRun { return x.rollup[f].base }
		rs, v := s.series(func(x pgRateRound) float64 { return rat(x).Rate() }, "%.0f")
		row(fmt.Sprintf(l+" exactly-once rollup pipeline (count, sum by status and minute), %d %s orders", s.records, names[f]),
			fmt.Sprintf("%.0f records/s (rounds: %s); ratchet %s", v, rs, cpuCell(rat, true)), "", "")
		dec := map[string]string{"json": "valyala/fastjson", "avro": "hamba/avro into a struct"}[f]
		rs, v = s.series(func(x pgRateRound) float64 { return base(x).Rate() }, "%.0f")
		row(fmt.Sprintf(l+" bare Poll loop decoding status and amount (%s)", dec),
			fmt.Sprintf("%.0f records/s (rounds: %s); loop %s", v, rs, cpuCell(base, false)), "", "")
		rs, v = s.series(func(x pgRateRound) float64 { return rat(x).Rate() / base(x).Rate() }, "%.2f")
		row(fmt.Sprintf(l+" %s rollup pipeline / Poll loop", names[f]), fmt.Sprintf("%.2f (rounds: %s)", v, rs), "≥ 0.8", passMiss(v >= 0.8))
	}
	if !s.pinned {
		// What the machine leaves: where a bare Poll loop that decodes two
		// fields, with the direct loop's own writing, already takes the
		// budget, no consumer of this client meets 0.8 here. A rollup
		// writes little: its baseline is the Poll loop itself, and what
		// the cores leave beyond that loop's own CPU is what batching,
		// aggregating, transactions and offsets may take.
		median := func(get func(pgRateRound) float64) float64 { _, v := s.series(get, "%.2f"); return v }
		for _, f := range pgRateRollupFormats {
			up := func(x pgRateRound) pgRatePair { return x.upsert[f] }
			rs, v := s.series(func(x pgRateRound) float64 { return cpuBudget(runtime.NumCPU(), up(x).ratchet, up(x).base) }, "%.2f")
			poll := median(func(x pgRateRound) float64 { return x.rollup[f].base.ratchetPer100k() })
			own := median(func(x pgRateRound) float64 { return up(x).base.ratchetPer100k() })
			rat := median(func(x pgRateRound) float64 { return up(x).ratchet.ratchetPer100k() })
			row(fmt.Sprintf(l+" CPU-s per 100k the %s upsert pipeline may take to reach 0.8 of the direct loop on %d busy cores (cores at that rate, less PostgreSQL's and the broker's in its runs)", names[f], runtime.NumCPU()),
				fmt.Sprintf("%.2f (rounds: %s); the bare Poll loop decoding two fields %.2f + the direct loop's own writing %.2f = %.2f; ratchet %.2f", v, rs, poll, own, poll+own, rat), "reported", "")
		}
		for _, f := range pgRateRollupFormats {
			ro := func(x pgRateRound) pgRatePair { return x.rollup[f] }
			rs, v := s.series(func(x pgRateRound) float64 { return cpuBudget(runtime.NumCPU(), ro(x).ratchet, ro(x).base) }, "%.2f")
			poll := median(func(x pgRateRound) float64 { return ro(x).base.ratchetPer100k() })
			rat := median(func(x pgRateRound) float64 { return ro(x).ratchet.ratchetPer100k() })
			row(fmt.Sprintf(l+" CPU-s per 100k the %s rollup pipeline may take to reach 0.8 of the Poll loop on %d busy cores (cores at that rate, less PostgreSQL's and the broker's in its runs)", names[f], runtime.NumCPU()),
				fmt.Sprintf("%.2f (rounds: %s); the bare Poll loop itself %.2f, leaving %.2f for everything past reading and decoding two fields; ratchet %.2f", v, rs, poll, v-poll, rat), "reported", "")
		}
	}
	for i, size := range s.txSizes {
		row(fmt.Sprintf(l+" direct pgx JSON-order upsert loop at %d rows/tx (one run)", size), fmt.Sprintf("%.0f records/s", s.txRates[i]), "", "")
	}
}

// method says how the section is measured.
func (s *pgRateReport) method() string {
	if s == nil || len(s.rounds) == 0 {
		return ""
	}
	if s.pinned {
		return fmt.Sprintf("- (l) pinned: the same %d rounds once more with the local PostgreSQL server (every process named `postgres`, so the backends it forks too) pinned to CPU 0 and this process (the engine with librdkafka's threads, the direct loop, the Poll loop) and the broker to the other CPUs (`sched_setaffinity` on every thread, undone after the section; `-pg-rate-pin`). Unpinned, on a machine of few cores, the direct loop leaves PostgreSQL nearly every core while the pipeline's engine takes part of them to read Kafka and evaluate, so the ratio weighs the client's CPU against the database's; pinned, PostgreSQL has the same CPU in the pipeline's runs as in the baseline's, as with the engine in a container of its own.\n", len(s.rounds))
	}
	txs := ""
	if len(s.txSizes) > 0 {
		var parts []string
		for _, t := range s.txSizes {
			parts = append(parts, strconv.Itoa(t))
		}
		txs = fmt.Sprintf(" After the rounds the direct JSON loop runs once more at each of %s rows per transaction (`-pg-rate-tx`), its rate only.", strings.Join(parts, ", "))
	}
	return fmt.Sprintf("- Against PostgreSQL's own rate (l): %d orders in each of JSON, Avro (registry wire format) and Protobuf (registry wire format, message index [0]; a stub registry serves both schemas), ten fields of which two are nested records (`customer{id,country,tier}`, `shipping{city,zip}`), order i to partition i %% 12 with key `o<i>` (distinct keys). %d rounds; in each, per format: an exactly-once drain (fresh group, records/s from the first record applied to the last) of an upsert pipeline writing the key (`value.id`) and four columns (`status`, `amount`, `customer.id`, `int(items)`) into its table, truncated first, and a direct loop writing the same rows (read back from the first drain, by partition, in offset order) with `INSERT … SELECT FROM unnest($1::text[], …) ON CONFLICT (order_id) DO UPDATE SET …`: one writer per partition (12), a pool of the engine's default size (%d), %d rows per transaction (`processing.batch_size`), each chunk its own transaction; then a rollup pipeline (count and sum of `amount` by `status` and minute of `record.timestamp`) on the JSON and Avro orders, checked by `sum(count)`, against a bare confluent-kafka-go `Poll` loop (ratchet's consumer settings, all 12 partitions assigned from the start, no commits) that decodes `status` and `amount` of every record (valyala/fastjson for JSON, hamba/avro into a two-field struct for Avro) and sums amounts per status. The pipeline goes first in odd rounds, the baseline in even ones; medians reported.%s CPU-seconds per 100,000 records: ratchet's is this process's user + system time (`/proc/self/stat`, the in-process engine with librdkafka's threads; for the direct loop the loop's) between the first record and the last; PostgreSQL's is the user + system time (`/proc/<pid>/stat` fields 14 and 15) of the backends serving the bench database: processes named `postgres` whose command line (which the server sets to `postgres: <cluster>: <user> <database> <client> <state>`) names the database, found by walking `/proc` every 250 ms from the run's start to its end (the walk runs in this process, so its cost is in ratchet's and the loop's figure); the WAL writer, checkpointer and background writer, shared by every database on the server, are left out. The log (`bench.log`) also gives the whole server's figure (every postmaster with its reaped children's `cutime` + `cstime` and its live children), which counts the other databases' work on the machine. Before each timed run that writes, a `CHECKPOINT` writes out what earlier runs left dirty, so no run pays for another's pages or meets a checkpoint that max_wal_size sets off. The budget rows (JSON and Avro, unpinned): on cores kept busy, an upsert pipeline at 0.8 of the direct loop's rate has the cores' time at that rate per record, less what PostgreSQL and the broker take per record in its own runs; set beside it, the bare Poll loop's CPU on the same records (reading and decoding two fields) and the direct loop's own (building and sending the rows), which any consumer that writes these rows pays at least; for a rollup the same against 0.8 of the Poll loop's rate, beside that loop's own CPU, so that what is left is what batching, aggregating, transactions and offsets may take.\n",
		s.records, len(s.rounds), s.conns, s.perTx, txs)
}

// postgresTicks is the CPU time (user + system, in clock ticks) that the
// local PostgreSQL server has used so far: for every postmaster, its own
// time and that of its reaped children, plus the time of its live children.
// A backend that ends between two readings moves from the live sum into
// its postmaster's cutime/cstime, so the difference of two readings counts
// it once.
func postgresTicks() float64 {
	procs := map[int]pgProc{}
	ents, err := readDirNames("/proc")
	if err != nil {
		return 0
	}
	for _, name := range ents {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		comm, f, ok := procStat(pid)
		if !ok || comm != "postgres" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		cu, _ := strconv.ParseFloat(f[13], 64)
		cs, _ := strconv.ParseFloat(f[14], 64)
		procs[pid] = pgProc{ppid: ppid, ticks: u + s, reaped: cu + cs}
	}
	return sumPostgres(procs)
}

// pgProc is one `postgres` process's CPU time, in clock ticks.
type pgProc struct {
	ppid   int
	ticks  float64 // utime + stime
	reaped float64 // cutime + cstime: its ended children's
}

// sumPostgres adds up the server's CPU time: each process whose parent is
// not a `postgres` process is a postmaster and counts with its ended
// children; the others count their own time.
func sumPostgres(procs map[int]pgProc) float64 {
	var sum float64
	for _, p := range procs {
		if _, child := procs[p.ppid]; child {
			sum += p.ticks
		} else {
			sum += p.ticks + p.reaped
		}
	}
	return sum
}

// ticksToSeconds turns clock ticks into seconds (USER_HZ, the unit of
// /proc/<pid>/stat, is 100 on Linux whatever the kernel's HZ).
func ticksToSeconds(t float64) float64 { return t / 100 }

// readDirNames lists the names in dir.
func readDirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

// procStat reads /proc/<pid>/stat: the command name (field 2) and the
// fields after it, from field 3 (state) on; ok is false when the process
// is gone or the line is short.
func procStat(pid int) (comm string, fields []string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", nil, false
	}
	return parseProcStat(string(b))
}

// parseProcStat splits a /proc/<pid>/stat line: the command name may hold
// spaces and parentheses, so the fields start after the last ')'.
func parseProcStat(s string) (comm string, fields []string, ok bool) {
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open {
		return "", nil, false
	}
	f := strings.Fields(s[close+1:])
	if len(f) < 15 {
		return "", nil, false
	}
	return s[open+1 : close], f, true
}

// pgBackendSampler follows the CPU time of the PostgreSQL backends serving
// one database: every interval it walks /proc for processes named
// `postgres` whose command line (`postgres: <cluster>: <user> <database>
// <client> <state>`, set by the server) names the database, and keeps each
// one's first and last reading. A backend's time after its last reading
// (at most an interval before it ended) is not counted; the server's
// auxiliary processes (WAL writer, checkpointer, background writer), which
// serve every database, are left out.
type pgBackendSampler struct {
	db    string
	stop  chan struct{}
	done  chan float64
	first map[int]float64
	last  map[int]float64
	other map[int]bool // processes seen that are not the database's backends
}

func startPGBackendSampler(db string, interval time.Duration) *pgBackendSampler {
	s := &pgBackendSampler{db: db, stop: make(chan struct{}), done: make(chan float64, 1), first: map[int]float64{}, last: map[int]float64{}, other: map[int]bool{}}
	s.sample(true)
	go func() { // ends when stopped
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.sample(false)
			case <-s.stop:
				s.sample(false)
				var sum float64
				for pid, v := range s.last {
					sum += v - s.first[pid]
				}
				s.done <- ticksToSeconds(sum)
				return
			}
		}
	}()
	return s
}

// sample reads the database's backends; at the start a backend's reading
// is its baseline, later a new backend's baseline is 0 (all its time is
// the run's).
func (s *pgBackendSampler) sample(start bool) {
	names, err := readDirNames("/proc")
	if err != nil {
		return
	}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || s.other[pid] {
			continue
		}
		comm, f, ok := procStat(pid)
		if !ok {
			continue
		}
		if comm != "postgres" {
			s.other[pid] = true
			continue
		}
		if _, known := s.first[pid]; !known {
			cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil {
				continue
			}
			if !slices.Contains(strings.Fields(strings.ReplaceAll(string(cmd), "\x00", " ")), s.db) {
				s.other[pid] = true
				continue
			}
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		if _, known := s.first[pid]; !known {
			if start {
				s.first[pid] = u + st
			} else {
				s.first[pid] = 0
			}
		}
		s.last[pid] = u + st
	}
}

// end stops sampling and returns the backends' CPU-seconds since the start.
func (s *pgBackendSampler) end() float64 {
	close(s.stop)
	return <-s.done
}
