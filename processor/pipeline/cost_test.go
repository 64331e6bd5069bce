package pipeline_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/store"
	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// costYAML filters with the expression: quadratic in the size of
// value.items.
const costYAML = `
kafka:
  topics: [orders]
pipelines:
  - name: seen
    topic: orders
    format: json
    where: value.items.map(x, value.items.map(y, x + y)).size() > 0
    upsert:
      table: seen
      key: { id: string(record.key) }
`

const costTables = `CREATE TABLE seen (id text PRIMARY KEY);`

// items is a record whose value.items has n integers.
func items(n int) string {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i % 10))
	}
	b.WriteString(`]}`)
	return b.String()
}

// An evaluation over the cost limit stops there and is a record error
// that says so; the other records of the batch are unaffected once it is
// isolated, and a small record passes the same expression.
func TestCostLimitMakesARecordError(t *testing.T) {
	pool, p := setup(t, costYAML, costTables)
	start := time.Now()
	err := apply(t, pool, p, rec(t, 0, "small", items(10)), rec(t, 1, "big", items(3000))) // 6 KB
	if !processor.IsPermanent(err) || !store.IsRecordError(err) {
		t.Fatalf("err = %v, want a permanent record error", err)
	}
	const want = "pipeline seen: record orders[0]@1: where: CEL cost over the pipeline's cost_limit 1000000 on this record"
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %q, want it to contain %q", err, want)
	}
	t.Logf("stopped after %v", time.Since(start))
	if err := apply(t, pool, p, rec(t, 0, "small", items(10))); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, `SELECT id FROM seen`, "small")

	// cost_limit raises it.
	pool, p = setup(t, strings.Replace(costYAML, "    format: json\n", "    format: json\n    cost_limit: 100000000\n", 1), costTables)
	if err := apply(t, pool, p, rec(t, 1, "big", items(300))); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, `SELECT id FROM seen`, "big")
}

// A stop (the batch's context ended) interrupts an evaluation within
// moments, and the batch fails as a retry, not as the record's fault.
func TestStopInterruptsAnEvaluation(t *testing.T) {
	// A limit no record meets: only the context can stop this one (about
	// a minute of work otherwise).
	pool, p := setup(t, strings.Replace(costYAML, "    format: json\n", "    format: json\n    cost_limit: 1000000000000\n", 1), costTables)
	for _, name := range []string{"before", "during"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var started time.Time
			if name == "before" {
				cancel()
				started = time.Now()
			}
			recs := []processor.Record{rec(t, 0, "big", items(20000))}
			b := processor.Batch{Topic: "orders", Start: 0, Next: 1, Records: recs}
			done := make(chan error, 1)
			go func() {
				done <- pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error { return p.Process(ctx, tx, b) })
			}()
			if name == "during" {
				select {
				case err := <-done:
					t.Fatalf("Process returned before the stop: %v", err)
				case <-time.After(200 * time.Millisecond): // the evaluation is under way: it takes a minute
				}
				cancel()
				started = time.Now()
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the evaluation went on 5 s after the stop")
			}
			t.Logf("returned %v after the stop", time.Since(started))
			if processor.IsPermanent(err) || store.IsRecordError(err) {
				t.Fatalf("err = %v: a stop is not the record's fault", err)
			}
			if !errors.Is(err, pipeline.ErrInterrupted) || !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want ErrInterrupted and context.Canceled", err)
			}
		})
	}
	assertRows(t, pool, `SELECT count(*)::text FROM seen`, "0")
}
