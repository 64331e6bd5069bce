package pipeline_test

import (
	"encoding/json"
	"strings"
	"testing"

	"ratchet/config"
	"ratchet/processor/pipeline"
)

// fingerprints loads yaml and returns the fingerprint of each pipeline by
// name.
func fingerprints(t *testing.T, yaml string) map[string]string {
	t.Helper()
	cfg, err := loadConfig(t, yaml)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, yaml)
	}
	out := map[string]string{}
	for _, p := range cfg.Pipelines {
		fp, _, err := pipeline.Fingerprint(p)
		if err != nil {
			t.Fatal(err)
		}
		out[p.Name] = fp
	}
	return out
}

// The same definition written differently (reordered keys and columns,
// flow or block style, comments, spacing inside expressions, redundant
// parentheses, case of table and column names, defaults spelled out, a
// different failure guard, another name) has one fingerprint.
func TestFingerprint(t *testing.T) {
	base := fingerprints(t, ordersYAML)
	same := `
kafka:
  topics: [orders]
pipelines:
  # the same pipelines, written otherwise
  - topic: orders
    upsert:
      on_tombstone: delete   # a comment
      columns:
        updated_at: record.timestamp
        amount: double( value.amount )
        customer: (value.customer.id)
      key: {order_id: "string(record.key)"}
      table: public.Orders
    where: >
      value.status
        != "test"
    format: json
    name: orders
    cost_limit: 1_000_000
    epoch_millis_window: {past: 7305d, future: 24h}
    errors: {max_ratio: 1}
  - name: revenue_per_minute
    topic: orders
    format: json
    rollup:
      aggregates: { smallest: min(double(value.amount)), biggest: max(double(value.amount)), revenue: sum(double(value.amount)), orders: count }
      group_by: { COUNTRY: value.customer.country }
      bucket_column: minute
      bucket: 60s
      time: value.ts
      table: revenue_per_minute
`
	got := fingerprints(t, same)
	for name, fp := range base {
		if !strings.HasPrefix(fp, pipeline.FingerprintVersion+":") || len(fp) != len("v1:")+64 {
			t.Fatalf("%s: fingerprint %q, want v1: and a sha256 in hex", name, fp)
		}
		if got[name] != fp {
			t.Errorf("%s: reformatted fingerprint %s, want %s", name, got[name], fp)
		}
	}
	// The name is not part of it: a renamed pipeline has the same
	// definition (what tells it apart is the name it is recorded under).
	renamed := fingerprints(t, strings.Replace(ordersYAML, "name: orders", "name: orders_v2", 1))
	if renamed["orders_v2"] != base["orders"] {
		t.Errorf("renamed fingerprint differs")
	}

	// Each change of what is written changes the fingerprint of the
	// pipeline it touches, and only of that one.
	changes := []struct{ name, pipeline, old, new string }{
		{"topic", "orders", "kafka:\n  topics: [orders]", "kafka:\n  topics: [orders, other]\n"},
		{"where", "orders", `where: value.status != "test"`, `where: value.status != "demo"`},
		{"no where", "orders", `    where: value.status != "test"` + "\n", ""},
		{"table", "orders", "table: orders", "table: orders2"},
		{"key expression", "orders", "order_id: string(record.key)", "order_id: string(value.id)"},
		{"key column", "orders", "order_id: string(record.key)", "id: string(record.key)"},
		{"column expression", "orders", "amount: double(value.amount)", "amount: double(value.total)"},
		{"column added", "orders", "updated_at: record.timestamp", "updated_at: record.timestamp, note: value.note"},
		{"column removed", "orders", "customer: value.customer.id, ", ""},
		{"on_tombstone", "orders", "on_tombstone: delete", "on_tombstone: ignore"},
		{"version", "orders", "on_tombstone: delete", "on_tombstone: delete\n      version: record.timestamp\n      version_column: updated_at"},
		{"cost_limit", "orders", "    on_tombstone: delete", "    on_tombstone: delete\n    cost_limit: 5000"},
		{"epoch window", "orders", "    on_tombstone: delete", "    on_tombstone: delete\n    epoch_millis_window: {past: 30d}"},
		{"rollup table", "revenue_per_minute", "table: revenue_per_minute", "table: revenue_per_hour"},
		{"rollup time", "revenue_per_minute", "time: value.ts", "time: record.timestamp"},
		{"bucket", "revenue_per_minute", "bucket: 1m", "bucket: 1h"},
		{"bucket column", "revenue_per_minute", "bucket_column: minute", "bucket_column: at"},
		{"group_by", "revenue_per_minute", "country: value.customer.country", "country: value.country"},
		{"aggregate", "revenue_per_minute", "biggest: max(double(value.amount))", "biggest: min(double(value.amount))"},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			yaml := strings.Replace(ordersYAML, c.old, c.new, 1)
			if yaml == ordersYAML {
				t.Fatalf("%q not in the configuration", c.old)
			}
			if c.name == "topic" {
				yaml = strings.Replace(yaml, "  - name: orders\n    topic: orders", "  - name: orders\n    topic: other", 1)
			}
			got := fingerprints(t, yaml)
			for name, fp := range base {
				if changed := got[name] != fp; changed != (name == c.pipeline) {
					t.Errorf("%s: changed=%v", name, changed)
				}
			}
		})
	}

	// Format and sink kind.
	format := strings.NewReplacer("format: json", "format: event")
	got = fingerprints(t, format.Replace(ordersYAML))
	if got["orders"] == base["orders"] {
		t.Error("format: fingerprint unchanged")
	}
	// The same table and columns as an append instead of an upsert.
	up := config.Pipeline{Name: "a", Topic: "t", Format: "json",
		Upsert: &config.Upsert{Table: "t", Key: []config.Column{{Name: "id", Expr: "value.id"}}}}
	ap := config.Pipeline{Name: "a", Topic: "t", Format: "json",
		Append: &config.Append{Table: "t", Columns: []config.Column{{Name: "id", Expr: "value.id"}}}}
	fu, _, _ := pipeline.Fingerprint(up)
	fa, _, _ := pipeline.Fingerprint(ap)
	if fu == fa {
		t.Error("sink kind: fingerprint unchanged")
	}
}

// The canonical definition is JSON with sorted keys, the defaults filled
// in and expressions printed by CEL, holding neither the name nor the
// failure guard.
func TestCanonicalDefinition(t *testing.T) {
	p := config.Pipeline{
		Name: "orders", Topic: "orders", Format: "json", Where: "value.a  >  1",
		Errors: config.PipelineErrors{MaxRatio: 1},
		Upsert: &config.Upsert{Table: "Sales.Orders", Key: []config.Column{{Name: "ID", Expr: "string(record.key)"}},
			Columns: []config.Column{{Name: "b", Expr: "value.b"}, {Name: "a", Expr: "(value.a + 1)"}}},
	}
	fp, canon, err := pipeline.Fingerprint(p)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"cost_limit":1000000,"epoch_millis_window":{"future":"24h0m0s","past":"175320h0m0s"},"format":"json",` +
		`"topic":"orders","upsert":{"columns":{"a":"value.a + 1","b":"value.b"},"key":{"id":"string(record.key)"},` +
		`"on_tombstone":"ignore","table":"sales.orders"},"version":"v1","where":"value.a > 1"}`
	if string(canon) != want {
		t.Fatalf("canonical =\n%s\nwant\n%s", canon, want)
	}
	var v map[string]any
	if err := json.Unmarshal(canon, &v); err != nil {
		t.Fatalf("canonical is not JSON: %v", err)
	}
	// The same definition gives the same bytes, call after call.
	fp2, canon2, _ := pipeline.Fingerprint(p)
	if fp2 != fp || string(canon2) != string(canon) {
		t.Fatal("fingerprint not stable")
	}
	// An expression that does not parse is kept as written.
	p.Where = "value.a >"
	_, canon, _ = pipeline.Fingerprint(p)
	if !strings.Contains(string(canon), `"where":"value.a \u003e"`) && !strings.Contains(string(canon), `"where":"value.a >"`) {
		t.Fatalf("unparsable where not kept: %s", canon)
	}
}
