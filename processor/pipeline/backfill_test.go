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

// Backfillable refuses an upsert without a version and an upsert that
// deletes on tombstones, and lets rollups, appends and versioned upserts
// through; Only keeps one pipeline.
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
		{"orders", "an upsert without upsert.version"},
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
	one, ok := set.Only("versioned")
	if !ok || strings.Join(one.Names(), ",") != "versioned" {
		t.Fatalf("Only(versioned) = %v, %v", one, ok)
	}
	if _, ok := set.Only("nope"); ok {
		t.Fatal("Only found a pipeline that is not configured")
	}
}
