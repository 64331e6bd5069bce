package schemareg

import (
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/processor"
)

// fuzzSchemas are learned by the fuzzed decoders without a registry: id 1
// defines ratchet.v1.Event second, id 2 is JSON, id 3 is unknown, id 4 is
// Avro.
func fuzzDecoder(tb testing.TB, format string) *Decoder {
	tb.Helper()
	proto1 := &Schema{ID: 1, Type: TypeProtobuf}
	err := proto1.parseProtobuf(nil, schemaregistry.SchemaInfo{SchemaType: TypeProtobuf, Schema: `syntax = "proto3";
package ratchet.v1;
import "google/protobuf/timestamp.proto";
message Other { message Inner { string x = 1; } }
message Event { string id = 1; string metric = 2; double value = 3; google.protobuf.Timestamp time = 4; map<string, string> labels = 5; }`})
	if err != nil || proto1.problem != "" {
		tb.Fatalf("parse: %v %s", err, proto1.problem)
	}
	d := NewDecoder(nil, format, metrics.New(prometheus.NewRegistry()))
	d.known[1] = proto1
	d.known[2] = &Schema{ID: 2, Type: TypeJSON}
	d.known[3] = &Schema{ID: 3, NotFound: true, retryAt: time.Now().Add(24 * time.Hour)}
	d.known[4] = &Schema{ID: 4, Type: TypeAvro}
	return d
}

// FuzzDecodeFramed: a framed value from Kafka never panics the decoder; a
// value whose schema is known decodes or is refused as poison with a short
// reason, and never asks for a lookup it already learned.
func FuzzDecodeFramed(f *testing.F) {
	ev := sampleEvent(1)
	pb, _ := proto.Marshal(ev)
	js, _ := protojson.Marshal(ev)
	for _, id := range []int32{1, 2, 3, 4, 5} {
		f.Add(append(event.AppendFrame(nil, id, []int{1}), pb...), true)
		f.Add(append(event.AppendFrame(nil, id, []int{0, 0}), pb...), true)
		f.Add(append(event.AppendFrame(nil, id, nil), js...), false)
	}
	f.Add(pb, true)
	f.Add([]byte{0}, true)
	decoders := map[bool]*Decoder{true: fuzzDecoder(f, event.FormatProtobuf), false: fuzzDecoder(f, event.FormatJSON)}
	f.Fuzz(func(t *testing.T, value []byte, protobuf bool) {
		d := decoders[protobuf]
		id, framed := event.SchemaIDOf(value)
		if framed && id >= 1 && id <= 4 && d.Missing(value) {
			t.Fatalf("schema id %d is learned but Missing says otherwise", id)
		}
		if d.Missing(value) {
			return // the partition would look it up first
		}
		rec := &processor.Record{Value: value}
		err := d.DecodeRecord(rec)
		if err == nil {
			if rec.Event == nil || event.Validate(rec.Event) != nil {
				t.Fatalf("accepted %x as %v", value, rec.Event)
			}
			return
		}
		if !event.IsPoison(err) || len(err.Error()) > 300 {
			t.Fatalf("error %q is not a short poison *event.Error", err)
		}
	})
}
