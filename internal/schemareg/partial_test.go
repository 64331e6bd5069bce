package schemareg

import (
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/hamba/avro/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/partial"
	"ratchet/processor"
)

// pair is a whole and a partial ValueDecoder of one schema.
type pair struct {
	whole, part *ValueDecoder
	tree        *reads
}

func newPair(t testing.TB, typ string, s *Schema, paths [][]string) *pair {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry())
	reg := &Registry{now: time.Now}
	p := &pair{whole: NewValueDecoder(reg, typ, m), part: NewValueDecoder(reg, typ, m), tree: newReads(paths)}
	p.whole.known[s.ID] = s
	p.part.known[s.ID] = s
	p.part.ReadOnly(paths)
	if p.part.reads == nil {
		t.Fatalf("paths %v read the whole value", paths)
	}
	return p
}

// check decodes value with both decoders: the same error, or values equal
// on the paths read. It returns whether the value decoded.
func (p *pair) check(t testing.TB, value []byte) bool {
	t.Helper()
	w := &processor.Record{Value: value}
	werr := p.whole.DecodeRecord(w)
	r := &processor.Record{Value: value}
	perr := p.part.DecodeRecord(r)
	if fmt.Sprint(werr) != fmt.Sprint(perr) {
		t.Fatalf("value %x: whole decode %v, partial decode %v", value, werr, perr)
	}
	if werr != nil {
		return false
	}
	if _, ok := w.Decoded.(*partial.Fields); ok {
		t.Fatalf("value %x: the whole decode gave partial.Fields", value)
	}
	// What the pipelines read of the partial value is its plain map
	// (partial.Fields.Get and partial.Plain read it as that map).
	wv, pv := project(w.Decoded, p.tree), project(partial.Plain(r.Decoded), p.tree)
	if !same(wv, pv) {
		t.Fatalf("value %x read at %v:\nwhole   %#v\npartial %#v", value, p.tree.pathList(), wv, pv)
	}
	return true
}

// partialAccepts reports whether the partial decode took value itself
// (no fall back to the whole decode).
func (p *pair) partialAccepts(t testing.TB, value []byte) bool {
	t.Helper()
	f, err := event.ParseFrame(value, p.part.format, p.part.schemaType == TypeProtobuf)
	if err != nil {
		t.Fatal(err)
	}
	s := p.part.known[f.SchemaID]
	if p.part.schemaType == TypeAvro {
		plan, _ := p.part.plans[planKey{s: s}].(*avroPlan)
		if plan == nil {
			return false
		}
		_, ok := decodeAvroPartial(plan, p.part.avroReader, nil, f.Payload)
		return ok
	}
	md, err := s.protoMessageAt(f.MessageIndexes)
	if err != nil {
		t.Fatal(err)
	}
	plan, _ := p.part.plans[planKey{s: s, md: md.UnwrapMessage()}].(*protoPlan)
	if plan == nil {
		return false
	}
	_, ok := decodeProtoPartial(plan, &p.part.proto, f.Payload)
	return ok
}

// project keeps of v what t reads: what the expressions can reach.
func project(v any, t *reads) any {
	m, ok := v.(map[string]any)
	if t.whole || !ok {
		return v
	}
	out := map[string]any{}
	for name, k := range t.kids {
		if kv, ok := m[name]; ok {
			out[name] = project(kv, k)
		}
	}
	return out
}

// same is reflect.DeepEqual with NaNs equal to themselves.
func same(a, b any) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || math.IsNaN(x) && math.IsNaN(y)) && math.Signbit(x) == math.Signbit(y)
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for k, e := range x {
			f, ok := y[k]
			if !ok || !same(e, f) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for i := range x {
			if !same(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func (t *reads) pathList() []string {
	var out []string
	var walk func(n *reads, prefix string)
	walk = func(n *reads, prefix string) {
		if n.whole {
			out = append(out, prefix)
			return
		}
		for name, k := range n.kids {
			walk(k, strings.TrimPrefix(prefix+"."+name, "."))
		}
	}
	walk(t, "")
	return out
}

func paths(ps ...string) [][]string {
	out := [][]string{}
	for _, p := range ps {
		out = append(out, strings.Split(p, "."))
	}
	return out
}

const partialAvroSchema = `{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "id", "type": "string"},
  {"name": "qty", "type": "int"},
  {"name": "total", "type": "long"},
  {"name": "price", "type": "double"},
  {"name": "ratio", "type": "float"},
  {"name": "paid", "type": "boolean"},
  {"name": "blob", "type": "bytes"},
  {"name": "nothing", "type": "null"},
  {"name": "note", "type": ["null", "string"]},
  {"name": "either", "type": ["string", "long"]},
  {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "day", "type": {"type": "int", "logicalType": "date"}},
  {"name": "elapsed", "type": {"type": "long", "logicalType": "time-micros"}},
  {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
  {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
  {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
  {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
  {"name": "tags", "type": {"type": "array", "items": "string"}},
  {"name": "counts", "type": {"type": "map", "values": "long"}},
  {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
    {"name": "name", "type": "string"},
    {"name": "age", "type": "int"},
    {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
      {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"]}]}}]}},
  {"name": "billing", "type": ["null", "Address"]},
  {"name": "shipping", "type": "Address"},
  {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
    {"name": "sku", "type": "string"}, {"name": "n", "type": "int"}]}}}]}`

func avroOrder(i int) map[string]any {
	note := "fragile"
	var notep *string
	if i%2 == 0 {
		notep = &note
	}
	var billing any
	if i%3 == 0 {
		billing = map[string]any{"shop.Address": map[string]any{"city": "Lyon", "zip": nil}}
	}
	var either any = map[string]any{"string": "s"}
	if i%2 == 1 {
		either = map[string]any{"long": int64(-i)}
	}
	return map[string]any{
		"id": fmt.Sprintf("o-%d", i), "qty": int32(i - 3), "total": int64(1) << (i % 62), "price": float64(i) / 3,
		"ratio": float32(i) / 7, "paid": i%2 == 0, "blob": []byte{byte(i), 0, 255}, "nothing": nil,
		"note": notep, "either": either,
		"at": time.UnixMilli(1764579690000 + int64(i)).UTC(), "day": time.Unix(int64(i)*86400, 0).UTC(),
		"elapsed": time.Duration(i) * time.Microsecond, "amount": big.NewRat(int64(i)*101, 100),
		"uid": "c2a0b8a4-7c1e-4f7e-9b1e-000000000001", "status": []string{"NEW", "PAID", "SHIPPED"}[i%3],
		"hash": [4]byte{1, 2, 3, byte(i)}, "tags": []string{"a", fmt.Sprint(i)}, "counts": map[string]any{"x": int64(i)},
		"customer": map[string]any{"name": "Ann", "age": int32(40 + i),
			"address": map[string]any{"city": "Paris", "zip": map[string]any{"int": int32(75000 + i)}}},
		"billing":  billing,
		"shipping": map[string]any{"city": "Nice", "zip": nil},
		"lines":    []any{map[string]any{"sku": "k", "n": int32(i)}},
	}
}

var partialAvroReads = [][][]string{
	paths("id", "qty", "total", "price"),
	paths("ratio", "paid", "blob", "nothing", "note", "either"),
	paths("at", "day", "elapsed", "amount", "uid", "status", "hash"),
	paths("tags", "counts", "lines"),
	paths("customer.name", "customer.address.zip", "billing.city", "shipping.zip"),
	paths("customer", "counts.x", "missing", "id.x", "lines.sku"),
	paths("customer.address"),
	{},
}

// TestAvroPartialEqualsWhole: for each set of read paths, the partial
// Avro decode gives the values the whole decode gives at those paths, on
// every field type, nested records, unions, logical types and absent
// (null) branches.
func TestAvroPartialEqualsWhole(t *testing.T) {
	sc := avro.MustParse(partialAvroSchema)
	s := &Schema{ID: 1, Type: TypeAvro, Text: partialAvroSchema}
	for _, ps := range partialAvroReads {
		t.Run(fmt.Sprint(ps), func(t *testing.T) {
			p := newPair(t, TypeAvro, s, ps)
			for i := range 12 {
				payload, err := avro.Marshal(sc, avroOrder(i))
				if err != nil {
					t.Fatal(err)
				}
				value := append(event.AppendFrame(nil, 1, nil), payload...)
				if !p.check(t, value) {
					t.Fatalf("record %d refused", i)
				}
				if !p.partialAccepts(t, value) {
					t.Fatalf("record %d: the partial decode fell back to the whole one", i)
				}
			}
		})
	}
}

// TestAvroPartialRefusesAsWhole: a payload the whole decode refuses is
// refused by the partial one with the same reason, also when the fault is
// in a field no pipeline reads.
func TestAvroPartialRefusesAsWhole(t *testing.T) {
	sc := avro.MustParse(partialAvroSchema)
	s := &Schema{ID: 1, Type: TypeAvro, Text: partialAvroSchema}
	good, err := avro.Marshal(sc, avroOrder(4))
	if err != nil {
		t.Fatal(err)
	}
	p := newPair(t, TypeAvro, s, paths("id"))
	refused := 0
	// Every truncation, and every byte of the payload set to values that
	// make bad lengths, indexes, booleans and varints.
	for n := range len(good) {
		if !p.check(t, append(event.AppendFrame(nil, 1, nil), good[:n]...)) {
			refused++
		}
	}
	for i := range good {
		for _, b := range []byte{0x01, 0x7f, 0x80, 0xff, 0x02, 0x03, 0x13} {
			bad := append(event.AppendFrame(nil, 1, nil), good...)
			bad[5+i] = b
			if !p.check(t, bad) {
				refused++
			}
		}
	}
	if refused < len(good) {
		t.Fatalf("only %d of the broken payloads refused", refused)
	}
}

const partialProtoSchema = `syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
message Address { string city = 1; int32 zip = 2; }
message Order {
  string id = 1;
  int32 qty = 2;
  int64 total = 3;
  double price = 4;
  float ratio = 5;
  bool paid = 6;
  bytes blob = 7;
  uint32 u32 = 8;
  uint64 u64 = 9;
  sint32 s32 = 10;
  sint64 s64 = 11;
  fixed32 f32 = 12;
  fixed64 f64 = 13;
  sfixed32 sf32 = 14;
  sfixed64 sf64 = 15;
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  Status status = 16;
  google.protobuf.Timestamp at = 17;
  google.protobuf.Duration took = 18;
  google.protobuf.StringValue maybe = 19;
  Address customer = 20;
  repeated string tags = 21;
  repeated int64 nums = 22;
  map<string, string> labels = 23;
  map<string, Address> places = 24;
  oneof pay { string card = 25; int64 cash = 26; Address voucher = 27; }
  optional int32 opt = 28;
  repeated Address lines = 29;
}`

func protoSchema(t testing.TB, text string) *Schema {
	t.Helper()
	s := &Schema{ID: 1, Type: TypeProtobuf}
	if err := s.parseProtobuf(nil, schemaregistry.SchemaInfo{SchemaType: TypeProtobuf, Schema: text}); err != nil {
		t.Fatal(err)
	}
	if s.problem != "" {
		t.Fatal(s.problem)
	}
	return s
}

// w builds protobuf wire.
type w []byte

func (b w) varint(n protowire.Number, v uint64) w {
	return protowire.AppendVarint(protowire.AppendTag(b, n, protowire.VarintType), v)
}
func (b w) bytes(n protowire.Number, v []byte) w {
	return protowire.AppendBytes(protowire.AppendTag(b, n, protowire.BytesType), v)
}
func (b w) str(n protowire.Number, v string) w { return b.bytes(n, []byte(v)) }
func (b w) f32(n protowire.Number, v uint32) w {
	return protowire.AppendFixed32(protowire.AppendTag(b, n, protowire.Fixed32Type), v)
}
func (b w) f64(n protowire.Number, v uint64) w {
	return protowire.AppendFixed64(protowire.AppendTag(b, n, protowire.Fixed64Type), v)
}

// protoOrders are messages that exercise proto semantics: repeated
// occurrences of singular fields, split nested messages, packed and
// unpacked repeated fields, oneof members replacing each other, wrong
// wire types, unknown fields, absent fields.
func protoOrders() [][]byte {
	addr := w{}.str(1, "Paris").varint(2, 75001)
	full := w{}.str(1, "o-1").varint(2, uint64(0xffffffff)).varint(3, 1<<40).f64(4, math.Float64bits(2.5)).
		f32(5, math.Float32bits(0.25)).varint(6, 1).str(7, "\x00\xff").varint(8, 7).varint(9, 1<<63).
		varint(10, protowire.EncodeZigZag(-5)).varint(11, protowire.EncodeZigZag(-1<<40)).f32(12, 9).f64(13, 10).
		f32(14, uint32(0xfffffffe)).f64(15, uint64(1<<63)).varint(16, 2).
		bytes(17, w{}.varint(1, 1764579690).varint(2, 5)).bytes(18, w{}.varint(1, 3).varint(2, 7)).
		bytes(19, w{}.str(1, "m")).bytes(20, addr).str(21, "a").str(21, "b").
		bytes(22, protowire.AppendVarint(protowire.AppendVarint(nil, 1), 2)).varint(22, 3).
		bytes(23, w{}.str(1, "k").str(2, "v")).bytes(24, w{}.str(1, "home").bytes(2, addr)).
		str(25, "visa").varint(28, 0).bytes(29, addr).bytes(29, w{})
	return [][]byte{
		nil, // every field absent
		full,
		// Last occurrence wins; a wrong wire type is an unknown field.
		w{}.str(1, "first").str(1, "second").varint(2, 1).varint(2, 2).f32(2, 3).varint(16, 9),
		// A nested message split in two occurrences merges.
		w{}.bytes(20, w{}.str(1, "Lyon")).bytes(20, w{}.varint(2, 69000)).
			bytes(17, w{}.varint(1, 10)).bytes(17, w{}.varint(2, 20)),
		// Oneof members replace each other.
		w{}.str(25, "visa").varint(26, 30).bytes(27, addr).bytes(27, w{}.varint(2, 1)),
		w{}.bytes(27, addr).str(25, "amex"),
		// Unknown fields of every wire type, and a group.
		append(w{}.varint(100, 1).f32(101, 2).f64(102, 3).str(103, "x"),
			protowire.AppendTag(append(protowire.AppendTag(nil, 104, protowire.StartGroupType), w{}.varint(1, 0)...), 104, protowire.EndGroupType)...),
		// A map entry without key or value, and one repeated.
		w{}.bytes(23, w{}).bytes(23, w{}.str(1, "k").str(2, "1")).bytes(23, w{}.str(1, "k").str(2, "2")),
		// Packed fixed-width and a zero-length packed run.
		w{}.bytes(22, nil).varint(22, 5).varint(28, 9),
	}
}

var partialProtoReads = [][][]string{
	paths("id", "qty", "total", "price", "ratio", "paid", "blob"),
	paths("u32", "u64", "s32", "s64", "f32", "f64", "sf32", "sf64", "status"),
	paths("at", "took", "maybe", "opt"),
	paths("customer.city", "card", "cash", "voucher.zip"),
	paths("customer", "tags", "nums", "labels", "places", "lines"),
	paths("labels.k", "places.home.city", "voucher", "missing", "at.seconds", "maybe.value"),
	{},
}

// TestProtoPartialEqualsWhole: for each set of read paths, the partial
// protobuf decode gives the values the whole decode gives at those paths.
func TestProtoPartialEqualsWhole(t *testing.T) {
	s := protoSchema(t, partialProtoSchema)
	for _, ps := range partialProtoReads {
		t.Run(fmt.Sprint(ps), func(t *testing.T) {
			p := newPair(t, TypeProtobuf, s, ps)
			for i, m := range protoOrders() {
				value := append(event.AppendFrame(nil, 1, []int{1}), m...)
				if !p.check(t, value) {
					t.Fatalf("message %d refused", i)
				}
				if !p.partialAccepts(t, value) {
					t.Fatalf("message %d: the partial decode fell back to the whole one", i)
				}
			}
		})
	}
}

// TestProtoPartialRefusesAsWhole: malformed wire (truncation, bad tags,
// bad lengths, invalid UTF-8, broken nested messages) anywhere in the
// message, read or not, is refused with the whole decode's reason.
func TestProtoPartialRefusesAsWhole(t *testing.T) {
	s := protoSchema(t, partialProtoSchema)
	p := newPair(t, TypeProtobuf, s, paths("id", "customer.city"))
	good := protoOrders()[1]
	refused := 0
	for n := range len(good) {
		if !p.check(t, append(event.AppendFrame(nil, 1, []int{1}), good[:n]...)) {
			refused++
		}
	}
	for i := range good {
		for _, b := range []byte{0x00, 0x07, 0x80, 0xff, 0x7f, 0x0c} {
			bad := append(event.AppendFrame(nil, 1, []int{1}), good...)
			bad[len(bad)-len(good)+i] = b
			if !p.check(t, bad) {
				refused++
			}
		}
	}
	for _, m := range [][]byte{
		w{}.str(1, "\xff"),                   // invalid UTF-8 in a read string
		w{}.str(21, "\xff"),                  // ... in an unread one
		w{}.bytes(20, w{}.str(1, "\xc0")),    // ... in a read nested message
		w{}.bytes(24, w{}.bytes(2, w{0x08})), // a truncated message in a map value
		w{}.bytes(22, []byte{0x80}),          // a truncated packed varint
		protowire.AppendTag(nil, 0, protowire.VarintType),
		protowire.AppendTag(nil, 5, protowire.EndGroupType),
	} {
		if p.check(t, append(event.AppendFrame(nil, 1, []int{1}), m...)) {
			t.Fatalf("malformed %x accepted", m)
		}
		refused++
	}
	if refused < len(good) {
		t.Fatalf("only %d of the broken payloads refused", refused)
	}
}

// TestProtoPartialFallsBackOutsideProto3: a proto2 message (required
// fields, closed enums) is decoded whole; the values are the same.
func TestProtoPartialFallsBackOutsideProto3(t *testing.T) {
	s := protoSchema(t, `syntax = "proto2";
package p2;
message M { required string id = 1; enum E { A = 1; B = 2; } optional E e = 2; optional int32 n = 3 [default = 7]; }`)
	p := newPair(t, TypeProtobuf, s, paths("id", "e", "n"))
	for _, m := range [][]byte{w{}.str(1, "x").varint(2, 2), w{}.str(1, "x").varint(2, 9), w{}.varint(3, 1)} {
		p.check(t, append(event.AppendFrame(nil, 1, []int{0}), m...))
	}
	if k := (planKey{s: s, md: mustMessage(t, s, 0)}); p.part.plans[k] != (*protoPlan)(nil) {
		t.Fatalf("a proto2 message got a partial plan")
	}
}

func mustMessage(t testing.TB, s *Schema, i int) protoreflect.MessageDescriptor {
	t.Helper()
	md, err := s.protoMessageAt([]int{i})
	if err != nil {
		t.Fatal(err)
	}
	return md.UnwrapMessage()
}

// FuzzPartialValueDecoder: on any payload, the partial decode of a set of
// read paths refuses what the whole decode refuses, with the same reason,
// and accepts what it accepts with the same values at those paths: which
// pipelines a topic has never changes which records are dead-lettered.
func FuzzPartialValueDecoder(f *testing.F) {
	as := &Schema{ID: 1, Type: TypeAvro, Text: partialAvroSchema}
	ps := protoSchema(f, partialProtoSchema)
	var avroPairs, protoPairs []*pair
	for _, p := range partialAvroReads {
		avroPairs = append(avroPairs, newPair(f, TypeAvro, as, p))
	}
	for _, p := range partialProtoReads {
		protoPairs = append(protoPairs, newPair(f, TypeProtobuf, ps, p))
	}
	sc := avro.MustParse(partialAvroSchema)
	for i := range 6 {
		payload, err := avro.Marshal(sc, avroOrder(i))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(payload, true, uint8(i))
	}
	for i, m := range protoOrders() {
		f.Add(m, false, uint8(i))
	}
	f.Fuzz(func(t *testing.T, payload []byte, isAvro bool, sel uint8) {
		if isAvro {
			avroPairs[int(sel)%len(avroPairs)].check(t, append(event.AppendFrame(nil, 1, nil), payload...))
		} else {
			protoPairs[int(sel)%len(protoPairs)].check(t, append(event.AppendFrame(nil, 1, []int{1}), payload...))
		}
	})
}

// TestAPartitionsPartialValuesStayTheirs: one partial ValueDecoder (a
// partition's) carves every record's fields from shared chunks; records
// decoded later never change what an earlier record decoded to.
func TestAPartitionsPartialValuesStayTheirs(t *testing.T) {
	for _, format := range []string{"avro", "protobuf"} {
		t.Run(format, func(t *testing.T) {
			s, typ := &Schema{ID: 1, Type: TypeAvro, Text: benchAvroOrder}, TypeAvro
			if format == "protobuf" {
				s, typ = protoSchema(t, benchProtoOrder), TypeProtobuf
			}
			p := newPair(t, typ, s, paths("id", "status", "amount", "customer.id", "items"))
			values := benchOrders(t, format == "avro")
			recs := make([]processor.Record, 3000)
			for i := range recs {
				recs[i] = processor.Record{Value: values[(i*7)%len(values)]}
				if err := p.part.DecodeRecord(&recs[i]); err != nil {
					t.Fatal(err)
				}
				if _, ok := recs[i].Decoded.(*partial.Fields); !ok {
					t.Fatalf("record %d decoded to %T, not partial.Fields", i, recs[i].Decoded)
				}
			}
			for i := range recs {
				w := &processor.Record{Value: recs[i].Value}
				if err := p.whole.DecodeRecord(w); err != nil {
					t.Fatal(err)
				}
				if got, want := project(partial.Plain(recs[i].Decoded), p.tree), project(w.Decoded, p.tree); !same(want, got) {
					t.Fatalf("record %d after 3000 decodes:\n%#v\nwant %#v", i, got, want)
				}
			}
		})
	}
}
