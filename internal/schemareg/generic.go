package schemareg

import (
	"fmt"
	"math/big"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jhump/protoreflect/desc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/partial"
	"ratchet/processor"
)

// ValueDecoder decodes values in the registry's wire format written with
// any Avro or Protobuf schema (the pipelines' formats avro and protobuf)
// into Record.Decoded: records and messages become map[string]any keyed
// by field name, arrays and repeated fields []any, maps map[string]any,
// integers int64 (unsigned protobuf ones uint64), floats float64, bytes
// []byte, enums their symbol's name, timestamps time.Time and durations
// time.Duration (Avro logical types, google.protobuf.Timestamp and
// Duration), decimals float64, and an Avro union its branch's value. A
// null record value (a tombstone) decodes to nothing and is not poison.
// Told what the pipelines read (ReadOnly), it builds a record or message
// read at some fields as a *partial.Fields of those fields instead of a
// map: the same values, read through Get or partial.Plain.
//
// Lookups work as for Decoder (Missing, Resolve: an outage waits, an
// unknown id is poison), which it embeds.
type ValueDecoder struct {
	*Decoder
	schemaType string // TypeAvro or TypeProtobuf
	// reads, when set (ReadOnly), is what the topic's pipelines read of a
	// value; plans holds per schema how to decode only that, and
	// avroReader is reused for every Avro value of the partition.
	reads      *reads
	plans      map[planKey]any
	avroReader *avro.Reader
	proto      protoScratch
	// slab is where the partly decoded values of the partition's records
	// are carved from (see partial.Slab).
	slab partial.Slab
}

// planKey names a plan: a schema, and of a protobuf schema the message.
type planKey struct {
	s  *Schema
	md protoreflect.MessageDescriptor
}

// NewValueDecoder returns the ValueDecoder of one partition for values of
// schemaType (TypeAvro or TypeProtobuf).
func NewValueDecoder(reg *Registry, schemaType string, m *metrics.Metrics) *ValueDecoder {
	format := "avro"
	if schemaType == TypeProtobuf {
		format = event.FormatProtobuf
	}
	d := &ValueDecoder{Decoder: &Decoder{reg: reg, format: format, known: map[int32]*Schema{},
		hits: m.RegistryCacheHits, now: reg.now}, schemaType: schemaType}
	d.proto.slab = &d.slab
	return d
}

// DecodeRecord parses rec.Value's framing and decodes the payload with the
// writer's schema into rec.Decoded. Every error is an *event.Error
// (poison).
func (d *ValueDecoder) DecodeRecord(rec *processor.Record) error {
	if rec.Value == nil {
		return nil // tombstone
	}
	f, err := event.ParseFrame(rec.Value, d.format, d.schemaType == TypeProtobuf)
	if err != nil {
		return err
	}
	s := d.known[f.SchemaID]
	switch {
	case s == nil:
		return poison(d.format, fmt.Sprintf("schema id %d was not looked up", f.SchemaID))
	case s.NotFound:
		return poison(d.format, fmt.Sprintf("schema id %d not found in the schema registry", f.SchemaID))
	case s.Type != d.schemaType:
		return poison(d.format, fmt.Sprintf("schema id %d is a %s schema, the pipeline's format is %s", f.SchemaID, s.Type, d.format))
	}
	d.hits.Inc()
	var v any
	if d.schemaType == TypeAvro {
		v, err = d.decodeAvro(s, f.Payload)
	} else {
		v, err = d.decodeProtobuf(s, f.MessageIndexes, f.Payload)
	}
	if err != nil {
		return poison(d.format, err.Error())
	}
	rec.Decoded = v
	return nil
}

// avroAPI decodes Avro values from Kafka with bounds: a count in the
// payload (an array's block length) cannot make the decoder allocate more
// than maxAvroElements elements at once, nor a string or bytes value more
// than 8 MiB, whatever the bytes say.
var avroAPI = avro.Config{MaxByteSliceSize: maxAvroBytes, MaxSliceAllocSize: maxAvroElements}.Freeze()

// maxAvroElements bounds the elements of one Avro array value, and
// maxAvroBytes the length of one string or bytes value.
const (
	maxAvroElements = 1 << 18
	maxAvroBytes    = 8 << 20
)

// decodeAvro decodes payload with s's Avro schema: of a record only the
// fields the topic's pipelines read when d knows them (ReadOnly) and the
// partial decode accepts the payload, else the whole value.
func (d *ValueDecoder) decodeAvro(s *Schema, payload []byte) (any, error) {
	if d.reads != nil {
		p, known := d.plans[planKey{s: s}].(*avroPlan)
		if !known {
			if rec, ok := s.parseAvro().(*avro.RecordSchema); ok {
				p = newAvroPlan(rec, d.reads)
			}
			d.plan(planKey{s: s}, p)
		}
		if p != nil {
			if d.avroReader == nil {
				d.avroReader = avro.NewReader(nil, 0, avro.WithReaderConfig(avroAPI))
			}
			if m, ok := decodeAvroPartial(p, d.avroReader, &d.slab, payload); ok {
				return m, nil
			}
		}
	}
	return s.decodeAvro(payload)
}

// plan remembers the plan of s, forgetting all of them past maxKnown
// (as the Decoder forgets its schemas).
func (d *ValueDecoder) plan(k planKey, p any) {
	if d.plans == nil || len(d.plans) >= maxKnown {
		d.plans = map[planKey]any{}
	}
	d.plans[k] = p
}

// parseAvro returns s's Avro schema, parsed on first use; nil when it
// does not parse (avroProblem says why).
func (s *Schema) parseAvro() avro.Schema {
	s.avroOnce.Do(func() {
		// A cache of its own: named types of different schemas (two
		// versions of one record) must not meet.
		sc, err := avro.ParseWithCache(s.Text, "", &avro.SchemaCache{})
		if err != nil {
			s.avroProblem = fmt.Sprintf("schema id %d is not an Avro schema that parses: %v", s.ID, err)
			return
		}
		s.avro = sc
	})
	return s.avro
}

// decodeAvro decodes payload with s's Avro schema, parsed on first use.
func (s *Schema) decodeAvro(payload []byte) (any, error) {
	s.parseAvro()
	if s.avroProblem != "" {
		return nil, fmt.Errorf("%s", s.avroProblem)
	}
	var v any
	if err := avroAPI.Unmarshal(s.avro, payload, &v); err != nil {
		return nil, fmt.Errorf("schema id %d: %v", s.ID, shorten(err.Error()))
	}
	if v == nil && s.avro.Type() != avro.Null {
		return nil, fmt.Errorf("schema id %d: no value (the payload is empty or truncated)", s.ID)
	}
	return avroValue(s.avro, v), nil
}

// avroValue turns what hamba/avro decodes into any into the values the
// pipelines read: unions unwrapped, numbers widened.
func avroValue(sc avro.Schema, v any) any {
	switch x := v.(type) {
	case nil:
		return nil
	case map[string]any:
		switch t := sc.(type) {
		case *avro.RecordSchema:
			for _, f := range t.Fields() {
				if fv, ok := x[f.Name()]; ok {
					x[f.Name()] = avroValue(f.Type(), fv)
				}
			}
			return x
		case *avro.MapSchema:
			for k, e := range x {
				x[k] = avroValue(t.Values(), e)
			}
			return x
		case *avro.UnionSchema:
			for name, inner := range x { // one branch: {type name: value}
				for _, b := range t.Types() {
					if unionName(b) == name {
						return avroValue(b, inner)
					}
				}
				return inner
			}
			return nil
		}
		return x
	case []any:
		if t, ok := sc.(*avro.ArraySchema); ok {
			for i, e := range x {
				x[i] = avroValue(t.Items(), e)
			}
		}
		return x
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case *big.Rat:
		f, _ := x.Float64()
		return f
	}
	if u, ok := sc.(*avro.UnionSchema); ok && len(u.Types()) > 0 {
		// A union hamba resolved to a plain value (a nullable union).
		for _, b := range u.Types() {
			if b.Type() != avro.Null {
				return avroValue(b, v)
			}
		}
	}
	if _, ok := sc.(*avro.FixedSchema); ok {
		if b, ok := fixedBytes(v); ok {
			return b
		}
	}
	return v
}

// unionName is the key hamba/avro gives a union branch: the full name of a
// named type, else the type's name.
func unionName(s avro.Schema) string {
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		return string(s.Type()) + "." + string(l.Logical().Type())
	}
	return string(s.Type())
}

// fixedBytes returns an Avro fixed value ([n]byte) as a slice.
func fixedBytes(v any) ([]byte, bool) {
	switch x := v.(type) {
	case []byte:
		return x, true
	case [16]byte:
		return x[:], true
	case [12]byte:
		return x[:], true
	case [8]byte:
		return x[:], true
	case [4]byte:
		return x[:], true
	}
	return nil, false
}

// decodeProtobuf decodes payload as the message of s at the message
// indexes path: only the fields the topic's pipelines read when d knows
// them (ReadOnly) and the partial decode accepts the payload, else the
// whole message.
func (d *ValueDecoder) decodeProtobuf(s *Schema, path []int, payload []byte) (any, error) {
	if d.reads == nil {
		return s.decodeProtobuf(path, payload)
	}
	md, err := s.protoMessageAt(path)
	if err != nil {
		return nil, err
	}
	k := planKey{s: s, md: md.UnwrapMessage()}
	p, known := d.plans[k].(*protoPlan)
	if !known {
		p = newProtoPlan(k.md, d.reads)
		d.plan(k, p)
	}
	if p != nil {
		if m, ok := decodeProtoPartial(p, &d.proto, payload); ok {
			return m, nil
		}
	}
	return s.decodeProtobuf(path, payload)
}

// decodeProtobuf decodes payload as the message of s at the message
// indexes path.
func (s *Schema) decodeProtobuf(path []int, payload []byte) (any, error) {
	md, err := s.protoMessageAt(path)
	if err != nil {
		return nil, err
	}
	m := dynamicpb.NewMessage(md.UnwrapMessage())
	if err := proto.Unmarshal(payload, m); err != nil {
		return nil, fmt.Errorf("schema id %d: %s: %v", s.ID, md.GetFullyQualifiedName(), err)
	}
	return protoMessage(m), nil
}

// protoMessageAt returns the message of s at the message indexes path.
func (s *Schema) protoMessageAt(path []int) (*desc.MessageDescriptor, error) {
	if s.problem != "" {
		return nil, fmt.Errorf("%s", s.problem)
	}
	if s.file == nil {
		return nil, fmt.Errorf("schema id %d has no parsed protobuf schema", s.ID)
	}
	var md *desc.MessageDescriptor
	msgs := s.file.GetMessageTypes()
	for _, i := range path {
		if i < 0 || i >= len(msgs) {
			return nil, fmt.Errorf("schema id %d has no message at indexes %v", s.ID, path)
		}
		md = msgs[i]
		msgs = md.GetNestedMessageTypes()
	}
	if md == nil {
		return nil, fmt.Errorf("schema id %d: no message indexes", s.ID)
	}
	return md, nil
}

// protoMessage turns a message into a map keyed by field name: every
// scalar field (its default when unset, as proto3 reads), message fields
// and oneof members only when set. Timestamps and durations become
// time.Time and time.Duration, wrappers their value.
func protoMessage(m protoreflect.Message) any {
	md := m.Descriptor()
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		f := md.Fields()
		return time.Unix(m.Get(f.ByName("seconds")).Int(), m.Get(f.ByName("nanos")).Int()).UTC()
	case "google.protobuf.Duration":
		f := md.Fields()
		return time.Duration(m.Get(f.ByName("seconds")).Int())*time.Second + time.Duration(m.Get(f.ByName("nanos")).Int())
	case "google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
		"google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
		"google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue":
		fd := md.Fields().ByName("value")
		return protoField(fd, m.Get(fd))
	}
	out := make(map[string]any, md.Fields().Len())
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if v, ok := protoPartialField(m, fd, readWhole); ok {
			out[string(fd.Name())] = v
		}
	}
	return out
}

// readWhole is the tree of a value read whole.
var readWhole = &reads{whole: true}

// protoField converts one singular value of fd.
func protoField(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return v.Bool()
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return v.Int()
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return v.Uint()
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return v.Float()
	case protoreflect.StringKind:
		return v.String()
	case protoreflect.BytesKind:
		return v.Bytes()
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name())
		}
		return int64(v.Enum())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return protoMessage(v.Message())
	}
	return nil
}

// shorten bounds an error text from a decoder of bytes from Kafka.
func shorten(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
