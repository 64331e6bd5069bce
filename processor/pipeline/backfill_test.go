package pipeline_test

import (
	"errors"
	"strings"
	"testing"

	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// A record carrying ratchet.backfill: NAME (a replayed dead letter of a
// backfill of NAME) is applied by pipeline NAME only: the other pipeline
// of the topic leaves it alone, while an unmarked record in the same
// batch goes to both.
func TestABackfillDeadLetterIsAppliedByItsPipelineOnly(t *testing.T) {
	pool, p := setup(t, ordersYAML, ordersTables)
	marked := rec(t, 0, "o1", order("o1", "new", "c1", "fr", "10", "2026-12-01T09:00:10Z"))
	marked.Headers = []processor.Header{{Key: "ratchet.replayed_from", Value: []byte("orders.dlq/0/3")},
		{Key: pipeline.HeaderBackfill, Value: []byte("revenue_per_minute")}}
	other := rec(t, 1, "o2", order("o2", "new", "c2", "fr", "5", "2026-12-01T09:00:20Z"))
	if err := apply(t, pool, p, marked, other); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, ordersRows, "o2 c2 5.00")
	assertRows(t, pool, revenueRows, "fr 09:00 2 15 10 5")

	toOrders := rec(t, 2, "o3", order("o3", "new", "c3", "de", "7", "2026-12-01T09:00:30Z"))
	toOrders.Headers = []processor.Header{{Key: pipeline.HeaderBackfill, Value: []byte("orders")}}
	if err := apply(t, pool, p, toOrders); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, ordersRows, "o2 c2 5.00", "o3 c3 7.00")
	assertRows(t, pool, revenueRows, "fr 09:00 2 15 10 5")
}

// Backfillable refuses an upsert that deletes on tombstones (with a
// version or without), and lets rollups, appends and upserts through;
// BackfillDescending marks the upserts without a version; Only keeps one
// pipeline.
func TestBackfillable(t *testing.T) {
	yaml := ordersYAML + `
  - name: versioned
    topic: orders
    format: json
    upsert:
      table: versioned
      key: { order_id: string(record.key) }
      columns: { amount: double(value.amount) }
      version: value.v
      version_column: v
  - name: versioned_deletes
    topic: orders
    format: json
    upsert:
      table: versioned2
      key: { order_id: string(record.key) }
      columns: { amount: double(value.amount) }
      version: value.v
      version_column: v
      on_tombstone: delete
`
	cfg, err := loadConfig(t, yaml)
	if err != nil {
		t.Fatal(err)
	}
	set, err := pipeline.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{
		{"revenue_per_minute", ""},
		{"versioned", ""},
		{"orders", "on_tombstone delete"},
		{"versioned_deletes", "on_tombstone delete"},
		{"nope", "no pipeline named nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := set.Backfillable(tc.name)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			case tc.want != "" && tc.name != "nope" && !errors.Is(err, pipeline.ErrNotBackfillable):
				t.Fatalf("err %v does not wrap ErrNotBackfillable", err)
			}
		})
	}
	for name, want := range map[string]bool{"revenue_per_minute": false, "versioned": false, "orders": true} {
		if got := set.BackfillDescending(name); got != want {
			t.Errorf("BackfillDescending(%s) = %t, want %t", name, got, want)
		}
	}
	one, ok := set.Only("versioned")
	if !ok || strings.Join(one.Names(), ",") != "versioned" {
		t.Fatalf("Only(versioned) = %v, %v", one, ok)
	}
	if _, ok := set.Only("nope"); ok {
		t.Fatal("Only found a pipeline that is not configured")
	}
}

// A record marked with ratchet.backfill is older than every row of its
// upsert's table when the upsert has no version: it writes a row only
// where the table has none for its key, the newest marked record of a key
// in the batch first, and every marked record still reaches PostgreSQL
// (a value the table refuses fails the batch wherever the batch's
// boundaries fall); an unmarked record of the same batch replaces rows as
// always.
func TestAnOlderRecordWritesOnlyWhereNoRowIs(t *testing.T) {
	const yaml = `
kafka:
  topics: [orders]
pipelines:
  - name: plain
    topic: orders
    format: json
    upsert:
      table: plain
      key:     { order_id: string(record.key) }
      columns: { amount: double(value.amount) }
`
	pool, p := setup(t, yaml, `CREATE TABLE plain (order_id text PRIMARY KEY, amount numeric(5,2))`)
	const rows = `SELECT order_id||' '||amount FROM plain ORDER BY 1`
	older := func(off int64, key, amount string) processor.Record {
		r := rec(t, off, key, `{"amount":`+amount+`}`)
		r.Headers = []processor.Header{{Key: pipeline.HeaderBackfill, Value: []byte("plain")}}
		return r
	}
	if err := apply(t, pool, p, rec(t, 100, "o1", `{"amount":10}`)); err != nil {
		t.Fatal(err)
	}
	err := apply(t, pool, p, older(1, "o1", "20"), older(2, "o2", "30"), older(3, "o2", "40"),
		older(4, "o3", "99999"), older(5, "o3", "50"))
	if err == nil || !strings.Contains(err.Error(), "numeric field overflow") {
		t.Fatalf("an older record of o3 the table refuses, behind a newer one of the same batch: err %v, want the overflow", err)
	}
	assertRows(t, pool, rows, "o1 10.00")
	if err := apply(t, pool, p, older(1, "o1", "20"), older(2, "o2", "30"), older(3, "o2", "40"), older(5, "o3", "50")); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, rows, "o1 10.00", "o2 40.00", "o3 50.00")
	if err := apply(t, pool, p, older(0, "o2", "1"), older(0, "o4", "4"), rec(t, 101, "o2", `{"amount":60}`), older(2, "o2", "70")); err != nil {
		t.Fatal(err)
	}
	assertRows(t, pool, rows, "o1 10.00", "o2 60.00", "o3 50.00", "o4 4.00")
}
