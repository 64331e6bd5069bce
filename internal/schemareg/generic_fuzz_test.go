package schemareg

import (
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/hamba/avro/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/processor"
)

const fuzzAvroSchema = `{"type": "record", "name": "R", "fields": [
  {"name": "s", "type": "string"}, {"name": "n", "type": ["null", "long"]},
  {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "a", "type": {"type": "array", "items": "double"}},
  {"name": "m", "type": {"type": "map", "values": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}}}]}`

// FuzzValueDecoder: a framed Avro or Protobuf value of any bytes never
// panics the pipelines' decoder; it decodes, or is refused as a short
// poison *event.Error.
func FuzzValueDecoder(f *testing.F) {
	m := metrics.New(prometheus.NewRegistry())
	reg := &Registry{now: time.Now}
	avroDec := NewValueDecoder(reg, TypeAvro, m)
	avroDec.known[1] = &Schema{ID: 1, Type: TypeAvro, Text: fuzzAvroSchema}
	avroDec.known[2] = &Schema{ID: 2, Type: TypeAvro, Text: `{"type": "record"`}
	avroDec.known[3] = &Schema{ID: 3, Type: TypeProtobuf}
	protoDec := NewValueDecoder(reg, TypeProtobuf, m)
	proto1 := &Schema{ID: 1, Type: TypeProtobuf}
	if err := proto1.parseProtobuf(nil, schemaregistry.SchemaInfo{SchemaType: TypeProtobuf, Schema: `syntax = "proto3";
package ratchet.v1;
import "google/protobuf/timestamp.proto";
message Other { message Inner { string x = 1; repeated int64 n = 2; } }
message Event { string id = 1; string metric = 2; double value = 3; google.protobuf.Timestamp time = 4; map<string, string> labels = 5; }`}); err != nil {
		f.Fatal(err)
	}
	protoDec.known[1] = proto1

	sc := avro.MustParse(fuzzAvroSchema)
	n := int64(7)
	av, err := avro.Marshal(sc, map[string]any{"s": "x", "n": &n, "t": time.UnixMilli(1764579690000), "a": []float64{1.5}, "m": map[string]any{"k": "Y"}})
	if err != nil {
		f.Fatal(err)
	}
	pb, _ := proto.Marshal(sampleEvent(1))
	f.Add(append(event.AppendFrame(nil, 1, nil), av...), true)
	f.Add(append(event.AppendFrame(nil, 2, nil), av...), true)
	f.Add(append(event.AppendFrame(nil, 3, nil), av...), true)
	f.Add(append(event.AppendFrame(nil, 1, []int{1}), pb...), false)
	f.Add(append(event.AppendFrame(nil, 1, []int{0, 0}), pb...), false)
	f.Add(append(event.AppendFrame(nil, 1, []int{7}), pb...), false)
	f.Add([]byte{0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, value []byte, isAvro bool) {
		d := protoDec
		if isAvro {
			d = avroDec
		}
		if id, ok := event.SchemaIDOf(value); !ok || d.known[id] == nil {
			return // the partition would look it up first
		}
		rec := &processor.Record{Value: value}
		err := d.DecodeRecord(rec)
		if err == nil {
			if rec.Decoded == nil {
				t.Fatalf("accepted %x without a value", value)
			}
			return
		}
		if !event.IsPoison(err) || len(err.Error()) > 400 {
			t.Fatalf("error %q is not a short poison *event.Error", err)
		}
	})
}
