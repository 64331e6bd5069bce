package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
)

// A value a record holds (here a card number in an amount field, and an
// email address in a time field) goes to the dead-letter topic with the
// record, in full in ratchet.error, and nowhere else: not in the log, not
// on the page or /api/state, which name the pipeline, the reason class and
// the SQLSTATE instead. With log.include_values the log and the page show
// it.
func TestRecordValuesStayInTheDeadLetter(t *testing.T) {
	const card, email = "4111 1111 1111 1111", "jane@example.com"
	for _, include := range []bool{false, true} {
		t.Run(fmt.Sprint("include_values=", include), func(t *testing.T) {
			cluster, addr := testenv.Kafka(t, 1, topic, topic+".dlq")
			db := testenv.Postgres(t)
			pool := openPool(t, db)
			if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (order_id text PRIMARY KEY, amount numeric, at timestamptz)`); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, addr, db, config.ModeExactlyOnce)
			cfg.HTTP.Addr = "127.0.0.1:0"
			cfg.Log.IncludeValues = include
			cfg.Pipelines = []config.Pipeline{{Name: "orders", Topic: topic, Format: config.PipelineJSON,
				Upsert: &config.Upsert{Table: "orders", Key: []config.Column{{Name: "order_id", Expr: "string(record.key)"}},
					Columns: []config.Column{{Name: "amount", Expr: "value.amount"}, {Name: "at", Expr: "value.at"}}}}}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			tp := topic
			var msgs []*kafka.Message
			for i, v := range []string{
				`{"amount": 10, "at": "2026-12-04T10:00:00Z"}`,
				fmt.Sprintf(`{"amount": %q, "at": "2026-12-04T10:00:00Z"}`, card),
				`{"amount": 11, "at": "2026-12-04T10:00:00Z"}`,
				fmt.Sprintf(`{"amount": 12, "at": %q}`, email),
			} {
				msgs = append(msgs, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: 0},
					Key: fmt.Appendf(nil, "o%d", i), Value: []byte(v)})
			}
			produceMessages(t, addr, msgs)
			var logs testenv.Buffer
			eng := startWith(t, cfg, engine.Options{}, testenv.Log{To: &logs, JSON: true})
			page := "http://" + eng.Addr(t, 30*time.Second)
			waitAppliedToEnd(t, cluster, pool, cfg.Kafka.GroupID)

			got := readDLQ(t, cluster, addr, topic+".dlq", 2)
			if len(got) != 2 {
				t.Fatalf("%d dead letters, want 2", len(got))
			}
			for _, e := range got {
				h := e.headers
				// PostgreSQL's message quotes the value it refused; the
				// dead letter keeps it.
				if e.offset == 1 && !strings.Contains(h["ratchet.error"], card) {
					t.Errorf("dead letter %d: ratchet.error %q lacks the record's value", e.offset, h["ratchet.error"])
				}
				if h["ratchet.pipeline"] != "orders" {
					t.Errorf("dead letter %d: ratchet.pipeline %q", e.offset, h["ratchet.pipeline"])
				}
			}
			var state string
			testenv.Eventually(t, 30*time.Second, func() bool {
				state = get(t, page+"/api/state")
				return strings.Contains(state, `"class":"refused_by_postgres"`)
			}, "the page's dead letters")
			var st struct {
				DeadLetters []struct{ Class, Pipeline, SQLState string } `json:"dead_letters"`
			}
			if err := json.Unmarshal([]byte(state), &st); err != nil {
				t.Fatal(err)
			}
			classes := map[string]bool{}
			for _, d := range st.DeadLetters {
				classes[d.Class+"/"+d.Pipeline+"/"+d.SQLState] = true
			}
			if !classes["refused_by_postgres/orders/22P02"] || !classes["expression/orders/"] || len(classes) != 2 {
				t.Errorf("page dead letters %+v, want refused_by_postgres 22P02 and expression, both of orders", st.DeadLetters)
			}
			html := get(t, page+"/")
			eng.Stop(t)
			for where, text := range map[string]string{"/api/state": state, "/": html} {
				if shown := strings.Contains(text, card) || strings.Contains(text, email); shown != include {
					t.Errorf("%s shows record values = %v, want %v", where, shown, include)
				}
			}
			leaked := strings.Contains(logs.String(), card) || strings.Contains(logs.String(), email)
			if leaked != include {
				t.Errorf("log shows record values = %v, want %v:\n%s", leaked, include, logs.Lines("dead letter"))
			}
		})
	}
}

func get(tb testing.TB, url string) string {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
