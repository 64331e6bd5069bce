package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/config"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

const benchYAML = `
kafka:
  topics: [orders]
pipelines:
  - name: orders
    topic: orders
    format: json
    where: value.status != "test"
    upsert:
      table: orders
      key:     { order_id: string(record.key) }
      columns: { customer: value.customer.id, amount: double(value.amount), updated_at: record.timestamp }
      on_tombstone: delete
  - name: revenue_per_minute
    topic: orders
    format: json
    rollup:
      table: revenue_per_minute
      time: value.ts
      bucket: 1m
      bucket_column: minute
      group_by: { country: value.customer.country }
      aggregates: { orders: count, revenue: sum(double(value.amount)), biggest: max(double(value.amount)), smallest: min(double(value.amount)) }
`

// compileYAML compiles the pipelines of a configuration file holding yaml.
func compileYAML(tb testing.TB, yaml string) *Set {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "ratchet.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		tb.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		tb.Fatal(err)
	}
	set, err := Compile(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return set
}

// BenchmarkCollect is the CEL cost per record: building the activation and
// evaluating the two pipelines (a where, an upsert of a key and
// three columns, a rollup of a time, a group and four aggregates) on one
// decoded JSON order, without the database. The figure per op is per
// record, both pipelines together.
func BenchmarkCollect(b *testing.B) {
	set := compileYAML(b, benchYAML)
	p := New(set, &Schema{tables: map[int]*table{}}, nil)
	recs := make([]processor.Record, 1000)
	for i := range recs {
		v := fmt.Sprintf(`{"status":"new","amount":%d.25,"ts":"2026-12-01T09:%02d:00Z","customer":{"id":"c%d","country":"c%d"}}`, i%100, i%60, i%97, i%7)
		recs[i] = processor.Record{Topic: "orders", Offset: int64(i), Key: fmt.Appendf(nil, "o%d", i%300), Value: []byte(v),
			Timestamp: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
		if err := (JSONDecoder{}).DecodeRecord(&recs[i]); err != nil {
			b.Fatal(err)
		}
	}
	pls := set.byTopic["orders"]
	states := make([]*batchState, len(pls))
	reset := func() {
		for i, pl := range pls {
			states[i] = &batchState{pl: pl, upserts: map[string]int{}, rollups: map[string]int{}}
		}
	}
	reset()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rec := &recs[i%len(recs)]
		act, err := activation(context.Background(), rec, "json", set.adapter)
		if err != nil {
			b.Fatal(err)
		}
		for _, st := range states {
			if err := p.collect(st, rec, act, false); err != nil {
				b.Fatal(err)
			}
		}
		if i++; i%len(recs) == 0 {
			reset() // a batch of 1000
		}
	}
}

// BenchmarkCollectDashboard is the CEL cost per record of the dashboard as
// a pipeline (examples/pipelines/dashboard.yaml) on ratchet.v1.Event.
func BenchmarkCollectDashboard(b *testing.B) {
	cfg, err := config.Load("../../examples/pipelines/dashboard.yaml", nil)
	if err != nil {
		b.Fatal(err)
	}
	set, err := Compile(cfg)
	if err != nil {
		b.Fatal(err)
	}
	p := New(set, &Schema{tables: map[int]*table{}}, nil)
	recs := make([]processor.Record, 1000)
	for i := range recs {
		recs[i] = processor.Record{Topic: "events", Offset: int64(i), Value: []byte{1},
			Event: &ratchetv1.Event{Id: fmt.Sprint(i), Metric: fmt.Sprintf("m%d", i%6), Value: float64(i % 100),
				Time: timestamppb.New(time.Date(2026, 12, 1, 9, i%60, 0, 0, time.UTC))}}
	}
	pl := set.byTopic["events"][0]
	st := &batchState{pl: pl, upserts: map[string]int{}, rollups: map[string]int{}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rec := &recs[i%len(recs)]
		act, _ := activation(context.Background(), rec, "event", set.adapter)
		if err := p.collect(st, rec, act, false); err != nil {
			b.Fatal(err)
		}
		if i++; i%len(recs) == 0 {
			st = &batchState{pl: pl, upserts: map[string]int{}, rollups: map[string]int{}}
		}
	}
}

// BenchmarkDecodeEvaluate is the cost per record of decoding a JSON order
// and evaluating the two pipelines on it (benchYAML), with the
// full decoder (DecodeJSON, every field) and with the topic's decoder
// (Set.JSONDecoder, only the fields the expressions read). The order is
// the one of BenchmarkCollect (every field read), or wide: the same with
// the fields an order carries that the pipelines do not read (items, an
// address, notes).
func BenchmarkDecodeEvaluate(b *testing.B) {
	set := compileYAML(b, benchYAML)
	p := New(set, &Schema{tables: map[int]*table{}}, nil)
	docs := map[string]func(i int) string{
		"order": func(i int) string {
			return fmt.Sprintf(`{"status":"new","amount":%d.25,"ts":"2026-12-01T09:%02d:00Z","customer":{"id":"c%d","country":"c%d"}}`,
				i%100, i%60, i%97, i%7)
		},
		"wide": func(i int) string {
			return fmt.Sprintf(`{"id":"o%d","status":"new","amount":%d.25,"currency":"EUR","ts":"2026-12-01T09:%02d:00Z",`+
				`"customer":{"id":"c%d","country":"c%d","name":"Customer %d","email":"c%d@example.com","tier":"gold"},`+
				`"items":[{"sku":"s1","qty":2,"price":10.5},{"sku":"s2","qty":1,"price":%d.75},{"sku":"s3","qty":3,"price":1.25}],`+
				`"shipping":{"street":"1 Rue de la Paix","city":"Paris","zip":"75002","country":"FR"},`+
				`"notes":"leave at the door \u00e9","tags":["web","promo"],"version":%d}`,
				i, i%100, i%60, i%97, i%7, i, i, i%50, i)
		},
	}
	for _, doc := range []string{"order", "wide"} {
		values := make([][]byte, 1000)
		for i := range values {
			values[i] = []byte(docs[doc](i))
		}
		for _, dec := range []struct {
			name string
			d    JSONDecoder
		}{{"full", JSONDecoder{}}, {"partial", set.JSONDecoder("orders", false)}} {
			b.Run(doc+"/"+dec.name, func(b *testing.B) {
				pls := set.byTopic["orders"]
				states := make([]*batchState, len(pls))
				reset := func() {
					for i, pl := range pls {
						states[i] = &batchState{pl: pl, upserts: map[string]int{}, rollups: map[string]int{}}
					}
				}
				reset()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					rec := processor.Record{Topic: "orders", Offset: int64(i), Key: fmt.Appendf(nil, "o%d", i%300),
						Value: values[i%len(values)], Timestamp: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
					if err := dec.d.DecodeRecord(&rec); err != nil {
						b.Fatal(err)
					}
					act, err := activation(context.Background(), &rec, "json", set.adapter)
					if err != nil {
						b.Fatal(err)
					}
					for _, st := range states {
						if err := p.collect(st, &rec, act, false); err != nil {
							b.Fatal(err)
						}
					}
					if i++; i%len(values) == 0 {
						reset() // a batch of 1000
					}
				}
			})
		}
	}
}

// BenchmarkDecode is the decode alone of BenchmarkDecodeEvaluate's wide
// order: the full decoder, and the topic's decoder of benchYAML (which
// reads status, amount, ts, customer.id and customer.country).
func BenchmarkDecode(b *testing.B) {
	set := compileYAML(b, benchYAML)
	value := []byte(`{"id":"o1","status":"new","amount":12.25,"currency":"EUR","ts":"2026-12-01T09:01:00Z",` +
		`"customer":{"id":"c1","country":"c1","name":"Customer 1","email":"c1@example.com","tier":"gold"},` +
		`"items":[{"sku":"s1","qty":2,"price":10.5},{"sku":"s2","qty":1,"price":1.75},{"sku":"s3","qty":3,"price":1.25}],` +
		`"shipping":{"street":"1 Rue de la Paix","city":"Paris","zip":"75002","country":"FR"},` +
		`"notes":"leave at the door \u00e9","tags":["web","promo"],"version":1}`)
	for _, dec := range []struct {
		name string
		d    JSONDecoder
	}{{"full", JSONDecoder{}}, {"partial", set.JSONDecoder("orders", false)}} {
		b.Run(dec.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			for b.Loop() {
				rec := processor.Record{Value: value}
				if err := dec.d.DecodeRecord(&rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCollectAppend is the cost per record of the bench's order log
// (make bench section (j2)): seven columns of an append evaluated on one
// decoded JSON order and written as a COPY row, without the database.
func BenchmarkCollectAppend(b *testing.B) {
	const yaml = `
kafka:
  topics: [orders]
pipelines:
  - name: order_log
    topic: orders
    format: json
    append:
      table: order_log
      columns: { part: record.partition, off: record.offset, order_id: string(record.key), status: value.status, customer: value.customer.id, amount: value.amount, at: record.timestamp }
`
	set := compileYAML(b, yaml)
	// The bench's table (make bench (j2)), so that each column converts
	// to its own kind.
	p := New(set, &Schema{tables: map[int]*table{0: {ident: "order_log", types: map[string]string{
		"part": "integer", "off": "bigint", "order_id": "text", "status": "text", "customer": "text",
		"amount": "double precision", "at": "timestamp with time zone"}}}}, nil)
	dec := set.JSONDecoder("orders", false)
	recs := make([]processor.Record, 1000)
	for i := range recs {
		v := fmt.Sprintf(`{"status":"new","amount":%d.25,"customer":{"id":"c%d","country":"fr"}}`, i%100, i%777)
		recs[i] = processor.Record{Topic: "orders", Partition: 3, Offset: int64(i), Key: fmt.Appendf(nil, "o%d", i), Value: []byte(v),
			Timestamp: time.Date(2026, 12, 1, 9, 0, i%60, 0, time.UTC)}
		if err := dec.DecodeRecord(&recs[i]); err != nil {
			b.Fatal(err)
		}
	}
	pl := set.byTopic["orders"][0]
	st := &batchState{pl: pl, upserts: map[string]int{}, rollups: map[string]int{}}
	st.aRows.take()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rec := &recs[i%len(recs)]
		act, err := activation(context.Background(), rec, "json", set.adapter)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.collect(st, rec, act, false); err != nil {
			b.Fatal(err)
		}
		if i++; i%len(recs) == 0 {
			st.aRows.release()
			st = &batchState{pl: pl, upserts: map[string]int{}, rollups: map[string]int{}}
			st.aRows.take()
		}
	}
}
