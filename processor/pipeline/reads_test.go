package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/cel-go/common/types/ref"

	"ratchet/processor"
)

// readsDocs are documents the expressions of TestFieldTreeReads are
// evaluated on, whole and partly decoded.
var readsDocs = []string{
	`{"a":{"b":"x","c":[1,2,{"d":3}],"n":12},"s":"str","l":[{"p":1},{"p":2}],"m":{"k":"v","j":2},"x":1.5,"u":"\u00e9\ud83d\ude00"}`,
	`{"a":"not an object","s":5,"l":[],"m":{},"x":null}`,
	`{"a":{"b":{"deep":true}},"a":{"c":[]},"s":"dup","s":"last"}`,
	`{"other":1}`,
	`{"a":{"b":null,"n":-0.0},"l":[{"q":1}],"x":18446744073709551616}`,
}

// TestFieldTreeReads: what an expression reads of value is the chain of
// constant field names it follows, and all of value for any other use;
// and evaluated on a document built only at those paths, every expression
// gives what it gives on the whole document (a value or the same error).
func TestFieldTreeReads(t *testing.T) {
	env, err := newEnv(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src  string
		want []string // "" is the whole value
	}{
		{`value.a.b`, []string{"a.b"}},
		{`value["a"].b`, []string{"a.b"}},
		{`value.a["b"]`, []string{"a.b"}},
		{`has(value.a.b)`, []string{"a.b"}},
		{`value.?a.b.orValue("none")`, []string{"a.b"}},
		{`value[?"a"].orValue(1)`, []string{"a"}},
		{`value.a.c[0]`, []string{"a.c"}},
		{`value.a.c[2].d`, []string{"a.c"}},
		{`value.l.exists(e, e.p == 2)`, []string{"l"}},
		{`value.l.map(e, e.p)`, []string{"l"}},
		{`size(value.m)`, []string{"m"}},
		{`"k" in value.m`, []string{"m"}},
		{`value.s + string(value.x)`, []string{"s", "x"}},
		{`string(record.key) + value.s`, []string{"s"}},
		{`value.a.b == value.a`, []string{"a"}},
		{`value.a.n > 3 ? value.s : value.u`, []string{"a.n", "s", "u"}},
		{`[value.s, value.x]`, []string{"s", "x"}},
		{`{"k": value.s, value.u: 1}`, []string{"s", "u"}},
		{`value.m[value.s]`, []string{"m", "s"}},
		{`value`, []string{""}},
		{`size(value)`, []string{""}},
		{`value[value.s]`, []string{""}},
		{`value.exists(k, k == "s")`, []string{""}},
		{`"a" in value`, []string{""}},
		{`type(value) == map`, []string{""}},
		{`[1].map(value, value + 1)[0] + size(value.m)`, []string{""}},
		{`string(record.key)`, nil},
		{`1 + 2`, nil},
	} {
		t.Run(tc.src, func(t *testing.T) {
			tree := &fieldTree{}
			c := &compiler{env: env, reads: tree}
			e := c.compile("k", tc.src, "")
			if e == nil {
				t.Fatalf("does not compile: %v", c.ps)
			}
			got := tree.paths()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("reads %q, want %q", got, tc.want)
			}
			for _, doc := range readsDocs {
				full, err := DecodeJSON([]byte(doc), false)
				if err != nil {
					t.Fatal(err)
				}
				part, err := decodePartial([]byte(doc), false, tree, nil)
				if err != nil {
					t.Fatal(err)
				}
				if w, g := evalOn(t, env.CELTypeAdapter(), e, full), evalOn(t, env.CELTypeAdapter(), e, part); g != w {
					t.Errorf("on %s: partly decoded gives %s, whole gives %s", doc, g, w)
				}
			}
		})
	}
}

// evalOn evaluates e with value v and describes the result.
func evalOn(t *testing.T, adapter interface {
	NativeToValue(any) ref.Val
}, e *expr, v any) string {
	t.Helper()
	act := &recordActivation{rec: &processor.Record{Value: []byte{1}, Key: []byte("k1")}, adapter: adapter, value: v}
	got, err := e.eval(act)
	if err != nil {
		return "error " + err.Error()
	}
	return fmt.Sprintf("%T %v", got, got.Value())
}

// TestCompileReads: a topic's decoder reads the union of what every
// expression of its pipelines reads (where, key, columns, version, time,
// group_by, aggregates), and a topic one of whose expressions uses value
// whole is decoded whole.
func TestCompileReads(t *testing.T) {
	yaml := `
kafka:
  topics: [orders, events]
pipelines:
  - name: orders
    topic: orders
    format: json
    where: value.status != "test"
    upsert:
      table: orders
      key:     { order_id: value.id }
      columns: { customer: value.customer.id, amount: double(value.amount) }
      version: value.meta.version
  - name: revenue
    topic: orders
    format: json
    rollup:
      table: revenue
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { country: value.customer.country }
      aggregates: { orders: count, revenue: sum(double(value.amount)), items: max(size(value.items)) }
  - name: events
    topic: events
    format: json
    append:
      table: events
      columns: { body: value, at: record.timestamp }
`
	set := compileYAML(t, yaml)
	got := set.reads["orders"].paths()
	slices.Sort(got)
	want := []string{"amount", "customer.country", "customer.id", "id", "items", "meta.version", "status", "ts"}
	if !slices.Equal(got, want) {
		t.Errorf("orders reads %q, want %q", got, want)
	}
	if d := set.JSONDecoder("orders", false); d.reads == nil || d.reads.whole {
		t.Errorf("the orders decoder decodes everything")
	}
	if d := set.JSONDecoder("events", false); d.reads != nil && !d.reads.whole {
		t.Errorf("the events decoder reads %q of a value used whole", strings.Join(d.reads.paths(), ","))
	}
	rec := processor.Record{Value: []byte(`{"id":"o1","status":"new","amount":12.5,"customer":{"id":"c1","country":"fr","name":"N"},` +
		`"ts":"2026-12-01T09:00:00Z","items":[1,2],"meta":{"version":3,"source":"x"},"notes":"long text"}`)}
	if err := set.JSONDecoder("orders", false).DecodeRecord(&rec); err != nil {
		t.Fatal(err)
	}
	wantV := `map[amount:12.5 customer:map[country:fr id:c1] id:o1 items:[1 2] meta:map[version:3] status:new ts:2026-12-01T09:00:00Z]`
	if g := fmt.Sprint(plainValue(rec.Decoded)); g != wantV {
		t.Errorf("decoded %s, want %s", g, wantV)
	}
	// The same paths for the Avro and Protobuf decoders.
	ps, ok := set.ReadPaths("orders")
	var joined []string
	for _, p := range ps {
		joined = append(joined, strings.Join(p, "."))
	}
	slices.Sort(joined)
	if !ok || !slices.Equal(joined, want) {
		t.Errorf("ReadPaths(orders) = %q, %v; want %q", joined, ok, want)
	}
	if ps, ok := set.ReadPaths("events"); ok {
		t.Errorf("ReadPaths(events) = %q of a value used whole", ps)
	}
	if ps, ok := set.ReadPaths("unknown"); ok {
		t.Errorf("ReadPaths(unknown) = %q", ps)
	}
}
