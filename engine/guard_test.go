package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/cli"
	"ratchet/internal/testenv"
)

// itemPipeline upserts items: the key, and amount read by amountExpr.
func itemPipeline(amountExpr string) config.Pipeline {
	return config.Pipeline{Name: "items", Topic: topic, Format: config.PipelineJSON,
		Upsert: &config.Upsert{Table: "items",
			Key:     []config.Column{{Name: "id", Expr: "string(record.key)"}},
			Columns: []config.Column{{Name: "amount", Expr: amountExpr}}}}
}

// produceItems produces n records with keys first.. over partitions, each
// {"amount": i}; poison(i) makes record i a record the pipeline refuses
// (an amount that is not a number).
func produceItems(tb testing.TB, addr string, first, n int, partitions int32, poison func(int) bool) {
	tb.Helper()
	tp := topic
	msgs := make([]*kafka.Message, 0, n)
	for i := first; i < first+n; i++ {
		v := fmt.Sprintf(`{"amount": %d}`, i)
		if poison != nil && poison(i) {
			v = `{"amount": "lots"}`
		}
		msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: int32(i) % partitions},
			Key: []byte(fmt.Sprintf("k%05d", i)), Value: []byte(v)})
	}
	produceMessages(tb, addr, msgs)
}

// readyz returns /readyz's status code and reason.
func readyz(tb testing.TB, base string) (int, string) {
	tb.Helper()
	res, err := http.Get(base + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	var body struct {
		State  string `json:"state"`
		Reason string `json:"reason"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return res.StatusCode, err.Error()
	}
	return res.StatusCode, body.State + ": " + body.Reason
}

func dlqCount(c *kfake.Cluster) int64 {
	var n int64
	for _, p := range c.PartitionInfos(topic + ".dlq") {
		n += p.HighWatermark
	}
	return n
}

func guardConfig(tb testing.TB, addr, db string, p config.Pipeline) config.Config {
	tb.Helper()
	cfg := testConfig(tb, addr, db, config.ModeExactlyOnce)
	cfg.Pipelines = []config.Pipeline{p}
	cfg.Processing.BatchSize = 50
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	cfg.HTTP.Addr = "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// TestPipelineTableFaultWaits: the pipeline's table changed while
// ratchet runs so that every statement fails (a column dropped: 42703; a
// column turned boolean: 42804) is a configuration error, not the
// records'. The records wait (nothing is dead-lettered), /readyz answers
// 503 naming the pipeline and the table, the metric counts it; once the
// table is fixed, every waiting record applies once.
func TestPipelineTableFaultWaits(t *testing.T) {
	for _, tc := range []struct{ name, breaks, fixes string }{
		{"column dropped", `ALTER TABLE items DROP COLUMN amount`, `ALTER TABLE items ADD COLUMN amount double precision`},
		{"column of the wrong type", `ALTER TABLE items ALTER COLUMN amount TYPE boolean USING amount <> 0`,
			`ALTER TABLE items ALTER COLUMN amount TYPE double precision USING amount::int`},
	} {
		t.Run(tc.name, func(t *testing.T) { testTableFaultWaits(t, tc.breaks, tc.fixes) })
	}
}

func testTableFaultWaits(t *testing.T, breaks, fixes string) {
	const partitions = 2
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	cfg := guardConfig(t, addr, db, itemPipeline("double(value.amount)"))
	reg := prometheus.NewRegistry()
	eng := startWith(t, cfg, engine.Options{Registry: reg}, testenv.Log{})
	base := "http://" + eng.Addr(t, 60*time.Second)

	produceItems(t, addr, 0, 100, partitions, nil)
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)

	if _, err := pool.Exec(ctx, breaks); err != nil {
		t.Fatal(err)
	}
	produceItems(t, addr, 100, 200, partitions, nil)
	testenv.Eventually(t, 60*time.Second, func() bool {
		code, why := readyz(t, base)
		return code == http.StatusServiceUnavailable && strings.Contains(why, "pipeline items") && strings.Contains(why, "table items")
	}, "/readyz 503 naming the pipeline and its table")
	if c := counter(t, reg, "ratchet_pipeline_config_errors_total", "pipeline", "items"); c < 1 {
		t.Errorf("ratchet_pipeline_config_errors_total{pipeline=items} = %v, want at least 1", c)
	}
	if n := dlqCount(cluster); n != 0 {
		t.Fatalf("%d records dead-lettered for the table's fault, want none", n)
	}

	if _, err := pool.Exec(ctx, fixes); err != nil {
		t.Fatal(err)
	}
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ := readyz(t, base)
		return code == http.StatusOK
	}, "/readyz 200 once the table is fixed")
	if got := count(t, pool, `SELECT count(*) FROM items`); got != 300 {
		t.Errorf("%d rows, want 300", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM items WHERE amount = substr(id, 2)::int AND substr(id, 2)::int >= 100`); got != 200 {
		t.Errorf("%d rows written after the fix with their amount, want 200", got)
	}
	if n := dlqCount(cluster); n != 0 {
		t.Errorf("%d records dead-lettered, want none", n)
	}
}

// TestPipelineFailureGuard: a pipeline whose every record fails (a typo
// in a field path) stops after at most min_failures dead letters instead
// of emptying its topic into the DLQ: the partitions are held (nothing
// committed past the last applied record), /readyz answers 503 naming the
// pipeline, the metric says so. Restarted with the typo fixed, ratchet
// applies every record not dead-lettered, and `ratchet dlq replay`
// brings back the ones that were: the table ends exact.
func TestPipelineFailureGuard(t *testing.T) {
	const partitions, n = 2, 1000
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	cfg := guardConfig(t, addr, db, itemPipeline("double(value.amout)"))
	produceItems(t, addr, 0, n, partitions, nil)
	reg := prometheus.NewRegistry()
	eng := startWith(t, cfg, engine.Options{Registry: reg}, testenv.Log{})
	base := "http://" + eng.Addr(t, 60*time.Second)

	testenv.Eventually(t, 60*time.Second, func() bool {
		code, why := readyz(t, base)
		return code == http.StatusServiceUnavailable && strings.Contains(why, "pipeline items") && strings.Contains(why, "failure guard")
	}, "/readyz 503 naming the tripped pipeline")
	if g := gaugeOf(t, reg, "ratchet_pipeline_guard_tripped", "pipeline", "items"); g != 1 {
		t.Errorf("ratchet_pipeline_guard_tripped{pipeline=items} = %v, want 1", g)
	}
	// Every letter in the DLQ is recorded with its offset (the partitions
	// commit each one), and no more come.
	var letters int64
	testenv.Eventually(t, 30*time.Second, func() bool {
		letters = dlqCount(cluster)
		return count(t, pool, `SELECT count(*) FROM ratchet_dead_letters`) == letters
	}, "dead letters recorded")
	if letters == 0 || letters > int64(config.DefaultPipelineMinFailures) {
		t.Fatalf("%d dead letters before the guard tripped, want 1..%d", letters, config.DefaultPipelineMinFailures)
	}
	var stored int64
	for _, next := range storedNext(t, pool, cfg.Kafka.GroupID) {
		stored += next
	}
	if stored >= n {
		t.Fatalf("stored offsets sum to %d of %d: the partitions were not held", stored, n)
	}
	if got := count(t, pool, `SELECT count(*) FROM items`); got != 0 {
		t.Fatalf("%d rows written by a pipeline whose every record fails", got)
	}
	t.Logf("guard tripped after %d dead letters; %d of %d records passed", letters, stored, n)
	// A held partition drains at once: its batch will never end by
	// itself, and waiting for it would spend shutdown.timeout.
	stopping := time.Now()
	eng.Stop(t)
	if d := time.Since(stopping); d > cfg.Shutdown.Timeout/2 {
		t.Errorf("stop took %s with the topic held (shutdown.timeout %s)", d, cfg.Shutdown.Timeout)
	}

	// Fixed: a changed definition under the same name, which the restart
	// refuses until its recorded history is reset on purpose (the table
	// holds nothing of the typo's).
	var out, errOut bytes.Buffer
	env := []string{"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + db, "RATCHET_KAFKA_TOPICS=" + topic,
		"RATCHET_KAFKA_GROUP_ID=" + cfg.Kafka.GroupID}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if code := cli.Run(rctx, []string{"pipelines", "reset", "items", "--execute"}, env, &out, &errOut); code != cli.ExitOK {
		t.Fatalf("pipelines reset: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	// Restarted: the held records apply.
	cfg = guardConfig(t, addr, db, itemPipeline("double(value.amount)"))
	startWith(t, cfg, engine.Options{}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	if got := count(t, pool, `SELECT count(*) FROM items`); got != n-letters {
		t.Fatalf("%d rows after the restart, want %d (all but the dead letters)", got, n-letters)
	}
	// The replay brings the dead letters back.
	if code := cli.Run(rctx, []string{"dlq", "replay", "--execute"}, env, &out, &errOut); code != cli.ExitOK {
		t.Fatalf("dlq replay: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM items`) == n
	}, "every record applied after the replay")
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	if got := count(t, pool, `SELECT count(*) FROM items WHERE amount = substr(id, 2)::int`); got != n {
		t.Errorf("%d rows exact, want %d", got, n)
	}
}

// TestPipelineGuardLeavesPoisonAlone: a 2 % poison rate never trips the
// guard: every bad record is dead-lettered, every good one applied.
func TestPipelineGuardLeavesPoisonAlone(t *testing.T) {
	const partitions, n = 2, 3000
	cluster, addr := testenv.Kafka(t, partitions, topic, topic+".dlq")
	db := testenv.Postgres(t)
	pool := openPool(t, db)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE items (id text PRIMARY KEY, amount double precision)`); err != nil {
		t.Fatal(err)
	}
	cfg := guardConfig(t, addr, db, itemPipeline("double(value.amount)"))
	poison := func(i int) bool { return i%50 == 7 }
	produceItems(t, addr, 0, n, partitions, poison)
	reg := prometheus.NewRegistry()
	startWith(t, cfg, engine.Options{Registry: reg}, testenv.Log{})
	waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)
	bad := int64(n / 50)
	testenv.Eventually(t, 30*time.Second, func() bool { return dlqCount(cluster) == bad }, "%d dead letters", bad)
	if got := count(t, pool, `SELECT count(*) FROM items`); got != n-bad {
		t.Errorf("%d rows, want %d", got, n-bad)
	}
	if g := gaugeOf(t, reg, "ratchet_pipeline_guard_tripped", "pipeline", "items"); g != 0 {
		t.Errorf("ratchet_pipeline_guard_tripped = %v, want 0", g)
	}
}
