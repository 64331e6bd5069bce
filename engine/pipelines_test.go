package engine_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/proto"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
)

// orderPipelines are the two pipelines of one topic: the latest
// order per key, and revenue per minute and country.
func orderPipelines() []config.Pipeline {
	return []config.Pipeline{
		{Name: "orders", Topic: topic, Format: config.PipelineJSON, Where: `value.status != "test"`,
			Upsert: &config.Upsert{Table: "orders",
				Key: []config.Column{{Name: "order_id", Expr: "string(record.key)"}},
				Columns: []config.Column{{Name: "customer", Expr: "value.customer.id"},
					{Name: "amount", Expr: "double(value.amount)"}, {Name: "updated_at", Expr: "record.timestamp"}},
				OnTombstone: config.TombstoneDelete}},
		{Name: "revenue_per_minute", Topic: topic, Format: config.PipelineJSON,
			Rollup: &config.Rollup{Table: "revenue_per_minute", Time: "value.ts", Bucket: time.Minute, BucketColumn: "minute",
				GroupBy: []config.Column{{Name: "country", Expr: "value.customer.country"}},
				Aggregates: []config.Column{{Name: "orders", Expr: "count"}, {Name: "revenue", Expr: "sum(double(value.amount))"},
					{Name: "biggest", Expr: "max(double(value.amount))"}, {Name: "smallest", Expr: "min(double(value.amount))"}}}},
	}
}

const orderTables = `
CREATE TABLE orders (order_id text PRIMARY KEY, customer text, amount double precision, updated_at timestamptz);
CREATE TABLE revenue_per_minute (country text NOT NULL, minute timestamptz NOT NULL, orders bigint, revenue double precision,
  biggest double precision, smallest double precision, PRIMARY KEY (country, minute));`

// orderInput is one produced record of the order stream and what the
// pipelines must make of it.
type orderInput struct {
	key, value string
	tombstone  bool
	partition  int32
	// poison is the text the record's ratchet.error must hold; empty for
	// a record both pipelines accept.
	poison   string
	status   string
	customer string
	country  string
	amount   float64
	ts       time.Time
}

// orderStream makes n records over 40 keys, with every kind of bad input:
// values that are not JSON, a record one pipeline cannot evaluate (each
// pipeline in turn), tombstones and records the where filters out.
func orderStream(n int, partitions int32) []*orderInput {
	base := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var out []*orderInput
	for i := range n {
		key := fmt.Sprintf("o%02d", i%40)
		in := &orderInput{key: key, partition: int32(i%40) % partitions,
			status: "new", customer: fmt.Sprintf("c%d", i%13), country: []string{"fr", "de", "es"}[i%3],
			amount: float64(i%17) + 0.25, ts: base.Add(time.Duration(i*7) * time.Second)}
		if i%29 == 0 {
			in.status = "test"
		}
		ts := in.ts.Format(time.RFC3339)
		customer := fmt.Sprintf(`{"id":%q,"country":%q}`, in.customer, in.country)
		switch {
		case i%41 == 5:
			in.value, in.poison = `{"status": "new", "amount": `, "json:"
		case i%37 == 11:
			customer = `null`
			in.poison = "pipeline orders: record events"
		case i%43 == 13:
			ts = "soon"
			in.poison = "pipeline revenue_per_minute: record events"
		case i%31 == 30:
			in.tombstone = true
		}
		if in.value == "" && !in.tombstone {
			in.value = fmt.Sprintf(`{"status":%q,"amount":%v,"ts":%q,"customer":%s}`, in.status, in.amount, ts, customer)
		}
		out = append(out, in)
	}
	return out
}

func produceOrders(tb testing.TB, addr string, in []*orderInput) {
	tb.Helper()
	t := topic
	msgs := make([]*kafka.Message, len(in))
	for i, r := range in {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: r.partition}, Key: []byte(r.key)}
		if !r.tombstone {
			m.Value = []byte(r.value)
		}
		msgs[i] = m
	}
	produceMessages(tb, addr, msgs)
}

// expectOrders returns the orders rows and revenue rollups the accepted
// records make, as the test queries print them.
func expectOrders(in []*orderInput) (orders, revenue []string) {
	type latest struct {
		customer string
		amount   float64
	}
	rows := map[string]latest{}
	type agg struct {
		n             int64
		sum, min, max float64
	}
	aggs := map[string]*agg{}
	for _, r := range in {
		switch {
		case r.poison != "":
			continue
		case r.tombstone:
			delete(rows, r.key)
			continue
		case r.status != "test":
			rows[r.key] = latest{r.customer, r.amount}
		}
		k := r.country + " " + r.ts.Truncate(time.Minute).Format("15:04")
		a, ok := aggs[k]
		if !ok {
			a = &agg{min: math.Inf(1), max: math.Inf(-1)}
			aggs[k] = a
		}
		a.n++
		a.sum += r.amount
		a.min, a.max = math.Min(a.min, r.amount), math.Max(a.max, r.amount)
	}
	for k, v := range rows {
		orders = append(orders, fmt.Sprintf("%s %s %v", k, v.customer, v.amount))
	}
	for k, a := range aggs {
		revenue = append(revenue, fmt.Sprintf("%s %d %v %v %v", k, a.n, a.sum, a.max, a.min))
	}
	sort.Strings(orders)
	sort.Strings(revenue)
	return orders, revenue
}

func readOrders(tb testing.TB, pool *pgxpool.Pool) (orders, revenue []string) {
	tb.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT order_id, customer, amount FROM orders ORDER BY order_id`)
	if err != nil {
		tb.Fatal(err)
	}
	for rows.Next() {
		var id, c string
		var a float64
		if err := rows.Scan(&id, &c, &a); err != nil {
			tb.Fatal(err)
		}
		orders = append(orders, fmt.Sprintf("%s %s %v", id, c, a))
	}
	rows, err = pool.Query(ctx, `SELECT country, minute, orders, revenue, biggest, smallest FROM revenue_per_minute`)
	if err != nil {
		tb.Fatal(err)
	}
	for rows.Next() {
		var c string
		var m time.Time
		var n int64
		var s, hi, lo float64
		if err := rows.Scan(&c, &m, &n, &s, &hi, &lo); err != nil {
			tb.Fatal(err)
		}
		revenue = append(revenue, fmt.Sprintf("%s %s %d %v %v %v", c, m.UTC().Format("15:04"), n, s, hi, lo))
	}
	sort.Strings(orders)
	sort.Strings(revenue)
	return orders, revenue
}

// waitAppliedToEnd waits until the group's stored offsets reach the end of
// every partition.
func waitAppliedToEnd(tb testing.TB, cluster *kfake.Cluster, pool *pgxpool.Pool, group string) {
	tb.Helper()
	testenv.Eventually(tb, 90*time.Second, func() bool {
		next := storedNext(tb, pool, group)
		for _, p := range cluster.PartitionInfos(topic) {
			if next[p.Partition] < p.HighWatermark {
				return false
			}
		}
		return true
	}, "every partition applied to its end")
}

// counter returns the value of the counter name of reg whose labels
// include the label pairs given; 0 when there is none.
func counter(tb testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	tb.Helper()
	return labelled(tb, reg, name, labels).GetCounter().GetValue()
}

// gaugeOf is counter for a gauge.
func gaugeOf(tb testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	tb.Helper()
	return labelled(tb, reg, name, labels).GetGauge().GetValue()
}

// labelled returns the first metric name of reg whose labels include the
// label pairs given, or nil (whose values read as 0).
func labelled(tb testing.TB, reg *prometheus.Registry, name string, labels []string) *dto.Metric {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			return m
		}
	}
	return nil
}

func diff(got, want []string) string {
	return "got:\n  " + strings.Join(got, "\n  ") + "\nwant:\n  " + strings.Join(want, "\n  ")
}

// TestPipelinesFromConfiguration: two pipelines read one JSON topic. Every
// accepted record is upserted (duplicate keys in a batch collapse to the
// last, tombstones delete) and counted in the rollup; a record that either
// pipeline refuses is applied by neither and dead-lettered once with the
// failing pipeline's name, while the rest of its batch goes on.
func TestPipelinesFromConfiguration(t *testing.T) {
	const partitions = 3
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	if _, err := pool.Exec(context.Background(), orderTables); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, addr, db, config.ModeExactlyOnce)
	cfg.Pipelines = orderPipelines()
	cfg.Processing.BatchSize = 50
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	in := orderStream(400, partitions)
	produceOrders(t, addr, in)
	reg := prometheus.NewRegistry()
	startWith(t, cfg, engine.Options{Registry: reg}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)

	wantOrders, wantRevenue := expectOrders(in)
	gotOrders, gotRevenue := readOrders(t, pool)
	if strings.Join(gotOrders, "\n") != strings.Join(wantOrders, "\n") {
		t.Errorf("orders table:\n%s", diff(gotOrders, wantOrders))
	}
	if strings.Join(gotRevenue, "\n") != strings.Join(wantRevenue, "\n") {
		t.Errorf("revenue_per_minute table:\n%s", diff(gotRevenue, wantRevenue))
	}

	// The dead-letter topic holds each refused record once, with the reason.
	type po struct {
		p int32
		o int64
	}
	offsets := map[int32]int64{}
	want := map[po]string{}
	for _, r := range in {
		if r.poison != "" {
			want[po{r.partition, offsets[r.partition]}] = r.poison
		}
		offsets[r.partition]++
	}
	t.Logf("%d orders rows, %d rollup rows, %d dead letters expected", len(wantOrders), len(wantRevenue), len(want))
	got := readDLQ(t, cluster, addr, topic+".dlq", len(want))
	// Each pipeline counts the records dead-lettered in its name.
	for name, prefix := range map[string]string{"orders": "pipeline orders:", "revenue_per_minute": "pipeline revenue_per_minute:"} {
		n := 0
		for _, reason := range want {
			if strings.HasPrefix(reason, prefix) {
				n++
			}
		}
		if c := counter(t, reg, "ratchet_pipeline_records_total", "pipeline", name, "result", "dead_lettered"); int(c) != n || n == 0 {
			t.Errorf("ratchet_pipeline_records_total{pipeline=%q,result=dead_lettered} = %v, want %d", name, c, n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("DLQ holds %d records, want %d", len(got), len(want))
	}
	for _, e := range got {
		reason, ok := want[po{e.partition, e.offset}]
		if !ok {
			t.Errorf("DLQ holds %d@%d (%s), which both pipelines accept", e.partition, e.offset, e.headers["ratchet.error"])
			continue
		}
		if !strings.Contains(e.headers["ratchet.error"], reason) {
			t.Errorf("DLQ record %d@%d: ratchet.error = %q, want it to contain %q", e.partition, e.offset, e.headers["ratchet.error"], reason)
		}
		// The pipeline and the reason class in headers of their own.
		wantPipeline, wantClass := "", "decode"
		for _, name := range []string{"orders", "revenue_per_minute"} {
			if strings.HasPrefix(reason, "pipeline "+name+":") {
				wantPipeline, wantClass = name, "expression"
			}
		}
		if p, c := e.headers["ratchet.pipeline"], e.headers["ratchet.reason"]; p != wantPipeline || c != wantClass {
			t.Errorf("DLQ record %d@%d: ratchet.pipeline %q, ratchet.reason %q; want %q, %q", e.partition, e.offset, p, c, wantPipeline, wantClass)
		}
	}
}

// TestEventPipelineTombstones: on a topic of ratchet.v1.Event (format
// event), a tombstone is not poison: an upsert pipeline with on_tombstone
// delete deletes its key, and nothing is dead-lettered.
func TestEventPipelineTombstones(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 2, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE latest (id text PRIMARY KEY, metric text, value double precision)`); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, addr, db, config.ModeExactlyOnce)
	cfg.Pipelines = []config.Pipeline{{Name: "latest", Topic: topic, Format: config.PipelineEvent,
		Upsert: &config.Upsert{Table: "latest", OnTombstone: config.TombstoneDelete,
			Key:     []config.Column{{Name: "id", Expr: "string(record.key)"}},
			Columns: []config.Column{{Name: "metric", Expr: "value.metric"}, {Name: "value", Expr: "value.value"}}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := &gen{}
	tp := topic
	var msgs []*kafka.Message
	want := map[string]bool{}
	for i := range 200 {
		id := fmt.Sprintf("k%d", i%30)
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: int32(i % 30 % 2)}, Key: []byte(id)}
		if i%7 == 6 {
			delete(want, id)
		} else {
			v, err := proto.Marshal(g.next())
			if err != nil {
				t.Fatal(err)
			}
			m.Value = v
			want[id] = true
		}
		msgs = append(msgs, m)
	}
	produceMessages(t, addr, msgs)
	start(t, cfg, nil, "")
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	var ids []string
	rows, err := pool.Query(context.Background(), `SELECT id FROM latest ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var wantIDs []string
	for id := range want {
		wantIDs = append(wantIDs, id)
	}
	sort.Strings(wantIDs)
	if strings.Join(ids, ",") != strings.Join(wantIDs, ",") || len(ids) == 0 || len(ids) == 30 {
		t.Errorf("rows %v, want %v", ids, wantIDs)
	}
	for _, p := range cluster.PartitionInfos(topic + ".dlq") {
		if p.HighWatermark != 0 {
			t.Errorf("dead-letter partition %d holds %d records, want none", p.Partition, p.HighWatermark)
		}
	}
}
