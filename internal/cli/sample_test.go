package cli

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/testenv"
	"ratchet/processor"
)

func TestSplitSample(t *testing.T) {
	tests := []struct {
		name  string
		n     int64
		avail map[int32]int64
		want  map[int32]int64
	}{
		{"even", 10, map[int32]int64{0: 100, 1: 100}, map[int32]int64{0: 5, 1: 5}},
		{"uneven remainder to the lowest partitions", 10, map[int32]int64{0: 100, 1: 100, 2: 100}, map[int32]int64{0: 4, 1: 3, 2: 3}},
		{"a short partition gives the rest to the others", 10, map[int32]int64{0: 1, 1: 100, 2: 100}, map[int32]int64{0: 1, 1: 5, 2: 4}},
		{"an empty partition", 6, map[int32]int64{0: 0, 1: 100}, map[int32]int64{0: 0, 1: 6}},
		{"fewer records than asked", 50, map[int32]int64{0: 3, 1: 4}, map[int32]int64{0: 3, 1: 4}},
		{"more partitions than records", 2, map[int32]int64{0: 9, 1: 9, 2: 9}, map[int32]int64{0: 1, 1: 1, 2: 0}},
		{"no partitions", 5, map[int32]int64{}, map[int32]int64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := splitSample(tt.n, tt.avail); !maps.Equal(got, tt.want) {
				t.Errorf("splitSample(%d, %v) = %v, want %v", tt.n, tt.avail, got, tt.want)
			}
		})
	}
}

// Flags that make no sense exit 2 naming the flag, before anything
// connects.
func TestPipelinesCheckSampleFlags(t *testing.T) {
	env := []string{"RATCHET_POSTGRES_URL=postgres://127.0.0.1:1/x", "RATCHET_KAFKA_BROKERS=127.0.0.1:1"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"negative sample", []string{"--sample", "-1"}, "--sample -1"},
		{"not a number", []string{"--sample", "many"}, "-sample"},
		{"threshold above 1", []string{"--sample", "10", "--threshold", "1.5"}, "--threshold 1.5"},
		{"negative threshold", []string{"--sample", "10", "--threshold", "-0.1"}, "--threshold -0.1"},
		{"threshold without sample", []string{"--threshold", "0.2"}, "--threshold needs --sample"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, env, append([]string{"pipelines", "check"}, tt.args...)...)
			if code != ExitConfig || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want exit %d naming %q", code, stderr, ExitConfig, tt.want)
			}
		})
	}
}

const sampleYAML = `
kafka:
  topics: [orders]
  group_id: shop
pipelines:
  - name: orders
    topic: orders
    format: json
    where: value.status != "test"
    upsert:
      table: orders
      key:     { order_id: string(record.key) }
      columns: { amount: AMOUNT, updated_at: record.timestamp }
  - name: audit
    topic: orders
    format: json
    append:
      table: audit
      columns: { order_id: string(record.key), status: value.status }
`

// `ratchet pipelines check --sample N` runs the pipelines on the last N
// records of their topic in a transaction it rolls back. The typo
// value.amout dead-letters every record: exit 2 naming the pipeline, the
// reason class and an example offset. The fixed pipeline exits 0 and says
// what each record would do, a value PostgreSQL refuses attributed to its
// record alone (the records after it are still written). Nothing lands in
// the tables, and no committed offset moves, the group's or any other.
func TestPipelinesCheckSample(t *testing.T) {
	_, addr := testenv.Kafka(t, 2, "orders")
	db := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE orders (order_id text PRIMARY KEY, amount numeric, updated_at timestamptz);
		CREATE TABLE audit (order_id text PRIMARY KEY, status text)`); err != nil {
		t.Fatal(err)
	}
	// 30 records per partition; the sample reads the last 10 of each. Of
	// those, one per partition is a test order (filtered by orders), and
	// partition 1's offset 25 has an amount numeric refuses.
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "log_level": 3})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	topic := "orders"
	deliveries := make(chan kafka.Event, 60)
	for part := range int32(2) {
		for i := range 30 {
			status, amount := "new", fmt.Sprint(i)
			if i == 22 {
				status = "test"
			}
			if part == 1 && i == 25 {
				amount = `"soon"`
			}
			err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: part},
				Key: fmt.Appendf(nil, "o-%d-%d", part, i), Value: fmt.Appendf(nil, `{"status": %q, "amount": %s}`, status, amount)}, deliveries)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 60 {
		if m := (<-deliveries).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}
	env := []string{"RATCHET_POSTGRES_URL=" + db, "RATCHET_KAFKA_BROKERS=" + addr}
	cfg, err := config.Load("", env)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Kafka.GroupID = "shop"
	// The group's position, committed from outside, as an operator would.
	k, err := openKafka(cfg, "shop")
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := k.commitOffsets([]kafka.TopicPartition{{Topic: &topic, Partition: 0, Offset: 7}, {Topic: &topic, Partition: 1, Offset: 9}}); err != nil {
		t.Fatal(err)
	}
	committed := func(group string) map[int32]int64 {
		t.Helper()
		g, err := openKafka(cfg, group)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		c, err := g.committed(topic, []int32{0, 1})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	before := committed("shop")
	ends := func() string {
		t.Helper()
		var out []string
		for _, p := range []int32{0, 1} {
			e, err := k.ends(ctx, topic, p)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprint(e))
		}
		return strings.Join(out, " ")
	}
	endsBefore := ends()
	untouched := func(t *testing.T) {
		t.Helper()
		if e := ends(); e != endsBefore {
			t.Errorf("the topic's offsets moved: %s, were %s", e, endsBefore)
		}
		if after := committed("shop"); !maps.Equal(after, before) {
			t.Errorf("the group's committed offsets moved: %v, were %v", after, before)
		}
		if c := committed(sampleGroup); c[0] != -1 || c[1] != -1 {
			t.Errorf("the sampling consumer committed %v", c)
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM audit)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d rows landed in the tables", n)
		}
	}

	t.Run("typo", func(t *testing.T) {
		path := writeConfig(t, strings.Replace(sampleYAML, "AMOUNT", "value.amout", 1))
		code, stdout, stderr := runCLI(t, env, "pipelines", "check", "--config", path, "--sample", "20")
		if code != ExitConfig {
			t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, ExitConfig, stdout, stderr)
		}
		for _, want := range []string{
			"ratchet: config: pipelines[0]: pipeline orders would dead-letter 18 of 20 sampled records of orders (90%), more than --threshold 0.5; mostly expression, e.g. offset 20 of partition 0: ",
			"amout",
		} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
		if strings.Contains(stderr, "pipelines[1]") {
			t.Errorf("stderr names the audit pipeline, which dead-letters nothing:\n%s", stderr)
		}
		for _, want := range []string{"sample of orders: offsets 0: 20..29, 1: 20..29", "18 expression, e.g. orders[0]@20: "} {
			if !strings.Contains(stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, stdout)
			}
		}
		untouched(t)
	})

	fixed := func(t *testing.T, env []string) {
		path := writeConfig(t, strings.Replace(sampleYAML, "AMOUNT", "value.amount", 1))
		code, stdout, stderr := runCLI(t, env, "pipelines", "check", "--config", path, "--sample", "20")
		if code != ExitOK {
			t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		t.Logf("stdout:\n%s", stdout)
		rows := map[string][]string{}
		for _, l := range strings.Split(stdout, "\n") {
			if f := strings.Fields(l); len(f) == 8 {
				rows[f[0]] = f[1:]
			}
		}
		// orders: 20 sampled, 17 written, 2 filtered (the test orders), 0
		// ignored, 1 dead-lettered (partition 1 offset 25), 0 blocked;
		// audit (an append, its COPY inside the sample's savepoints) applies
		// neither the refused record (blocked) nor writes it.
		if want := "pipeline audit: ok (orders append into audit)"; !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
		if got := strings.Join(rows["orders"], " "); got != "orders 20 17 2 0 1 0" {
			t.Errorf("orders row %q, want %q", got, "orders 20 17 2 0 1 0")
		}
		if got := strings.Join(rows["audit"], " "); got != "orders 20 19 0 0 0 1" {
			t.Errorf("audit row %q, want %q", got, "orders 20 19 0 0 0 1")
		}
		if want := `1 refused_by_postgres (sqlstate 22P02), e.g. orders[1]@25: pipeline orders: upsert 1 rows of orders: ERROR: invalid input syntax for type numeric: "…" (SQLSTATE 22P02)`; !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
		untouched(t)
	}
	t.Run("fixed", func(t *testing.T) { fixed(t, env) })
	// Savepoints live inside the one transaction: the same run behind
	// PgBouncer in transaction mode, whose small pool hands consecutive
	// transactions other server sessions.
	t.Run("behind pgbouncer", func(t *testing.T) {
		bouncer := testenv.StartPgBouncer(t, db, testenv.PgBouncerOptions{PoolSize: 2})
		fixed(t, []string{"RATCHET_POSTGRES_URL=" + bouncer.URL(), "RATCHET_KAFKA_BROKERS=" + addr})
	})
}

// A record `dlq replay` re-produced for another consumer group is passed
// by, as the engine passes it by: neither sampled nor dead-lettered.
func TestApplySampleSkipsReplaysOfOtherGroups(t *testing.T) {
	s := &pipelineSample{name: "orders", results: map[string]int{}, reasons: map[sampleReasonKey]*sampleReason{}}
	err := applySample(context.Background(), nil, nil, &sampleCounters{got: map[string]string{}}, []*pipelineSample{s},
		processor.Record{Topic: "orders"}, fmt.Errorf(`replay for group "other": %w`, actors.ErrSkip))
	if err != nil || s.sampled != 0 || len(s.results) != 0 {
		t.Errorf("err %v, sampled %d, results %v; want nothing counted", err, s.sampled, s.results)
	}
}
