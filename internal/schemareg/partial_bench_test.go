package schemareg

import (
	"fmt"
	"math"
	"testing"

	"github.com/hamba/avro/v2"

	"ratchet/internal/event"
	"ratchet/processor"
)

// The order of bench section (l): ten fields, two nested.
const benchAvroOrder = `{"type": "record", "name": "Order", "namespace": "bench.v1", "fields": [
  {"name": "id", "type": "string"}, {"name": "status", "type": "string"}, {"name": "amount", "type": "double"},
  {"name": "currency", "type": "string"},
  {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
    {"name": "id", "type": "string"}, {"name": "country", "type": "string"}, {"name": "tier", "type": "string"}]}},
  {"name": "shipping", "type": {"type": "record", "name": "Shipping", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": "string"}]}},
  {"name": "items", "type": "long"}, {"name": "created_at", "type": "string"},
  {"name": "tags", "type": {"type": "array", "items": "string"}}, {"name": "channel", "type": "string"}]}`

const benchProtoOrder = `syntax = "proto3";
package bench.v1;
message Order {
  message Customer { string id = 1; string country = 2; string tier = 3; }
  message Shipping { string city = 1; string zip = 2; }
  string id = 1; string status = 2; double amount = 3; string currency = 4;
  Customer customer = 5; Shipping shipping = 6; int64 items = 7; string created_at = 8;
  repeated string tags = 9; string channel = 10;
}`

var benchReads = map[string][][]string{
	"upsert": paths("id", "status", "amount", "customer.id", "items"),
	"rollup": paths("status", "amount"),
}

func benchOrders(b testing.TB, isAvro bool) [][]byte {
	b.Helper()
	sc := avro.MustParse(benchAvroOrder)
	var out [][]byte
	for i := range 64 {
		if isAvro {
			p, err := avro.Marshal(sc, map[string]any{"id": fmt.Sprintf("o%d", i), "status": "paid", "amount": float64(i) / 4,
				"currency": "EUR", "customer": map[string]any{"id": fmt.Sprintf("c%d", i), "country": "fr", "tier": "gold"},
				"shipping": map[string]any{"city": "Paris", "zip": "75001"}, "items": int64(1 + i%9),
				"created_at": "2026-11-01T00:00:00Z", "tags": []string{"web", "promo"}, "channel": "app"})
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, append(event.AppendFrame(nil, 1, nil), p...))
			continue
		}
		m := w{}.str(1, fmt.Sprintf("o%d", i)).str(2, "paid").f64(3, math.Float64bits(float64(i)/4)).str(4, "EUR").
			bytes(5, w{}.str(1, fmt.Sprintf("c%d", i)).str(2, "fr").str(3, "gold")).
			bytes(6, w{}.str(1, "Paris").str(2, "75001")).varint(7, uint64(1+i%9)).str(8, "2026-11-01T00:00:00Z").
			str(9, "web").str(9, "promo").str(10, "app")
		out = append(out, append(event.AppendFrame(nil, 1, []int{0}), m...))
	}
	return out
}

// BenchmarkValueDecoder: one record of bench section (l), decoded whole
// and for the fields the upsert and the rollup pipelines read.
func BenchmarkValueDecoder(b *testing.B) {
	for _, format := range []string{"avro", "protobuf"} {
		var s *Schema
		typ := TypeAvro
		if format == "avro" {
			s = &Schema{ID: 1, Type: TypeAvro, Text: benchAvroOrder}
		} else {
			typ = TypeProtobuf
			s = protoSchema(b, benchProtoOrder)
		}
		values := benchOrders(b, format == "avro")
		for _, reads := range []string{"whole", "upsert", "rollup"} {
			b.Run(format+"/"+reads, func(b *testing.B) {
				var d *ValueDecoder
				if reads == "whole" {
					d = newPair(b, typ, s, paths("id")).whole
				} else {
					p := newPair(b, typ, s, benchReads[reads])
					for _, v := range values {
						p.check(b, v)
					}
					d = p.part
				}
				i := 0
				for b.Loop() {
					rec := processor.Record{Value: values[i%len(values)]}
					if err := d.DecodeRecord(&rec); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}
