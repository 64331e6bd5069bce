package schemareg

import (
	"github.com/hamba/avro/v2"

	"ratchet/internal/partial"
)

// avroPlan is how to decode one Avro record schema for one reads tree:
// per field of the record in its written order, skip it, build it whole,
// or (a record read at some of its fields) follow a nested plan.
type avroPlan struct {
	fields []avroField
	// names are the fields read, in written order: the decoded value is
	// a partial.Fields of them.
	names []string
	index map[string]int
}

type avroField struct {
	name string
	typ  avro.Schema
	read bool      // in the value: built whole unless sub is set
	slot int       // of a read field, its index in names
	sub  *avroPlan // a record read at some fields
}

// newAvroPlan plans rec for t. A field that is a record (not a reference
// to a named one) and is read at some of its fields gets a plan of its
// own; every other read field is built whole, as the whole decode builds
// it (unions, references, logical types included), so that the values of
// the paths read are the same whichever decode runs.
func newAvroPlan(rec *avro.RecordSchema, t *reads) *avroPlan {
	p := &avroPlan{fields: make([]avroField, len(rec.Fields()))}
	for i, f := range rec.Fields() {
		af := avroField{name: f.Name(), typ: f.Type()}
		if k := t.kids[f.Name()]; k != nil {
			af.read, af.slot = true, len(p.names)
			p.names = append(p.names, f.Name())
			if sub, ok := f.Type().(*avro.RecordSchema); ok && !k.whole {
				af.sub = newAvroPlan(sub, k)
			}
		}
		p.fields[i] = af
	}
	p.index = partial.Index(p.names)
	return p
}

// decodeAvroPartial decodes payload with s's Avro schema (a record) as
// decodeAvro does, but builds only the fields of p; r is the partition's
// reader, reused. ok is false when the partial decode does not accept the
// payload (anything the whole decode might refuse, and also what it might
// not): the caller then runs the whole decode, which decides. The value
// is carved from slab (the partition's; nil: allocated on its own).
//
// It reads the payload with hamba/avro's own Reader primitives (ReadInt,
// ReadLong, ReadBool, ReadString, ReadBlockHeader...) at the same
// positions as the whole decode, and builds read fields with the Reader's
// ReadVal into an any, the very decoder the whole decode runs for a field
// of a record decoded into an any. Skipping is at least as strict as
// decoding: every bound and check of the whole decode is made (varint
// lengths, negative or oversized string lengths, enum and union indexes,
// booleans other than 0 and 1, array sizes, truncation); hamba's own skip
// decoders are laxer and are not used.
func decodeAvroPartial(p *avroPlan, r *avro.Reader, slab *partial.Slab, payload []byte) (*partial.Fields, bool) {
	r.Reset(payload)
	r.Error = nil
	m := p.decode(r, slab)
	if r.Error != nil || m == nil {
		r.Error = nil
		return nil, false
	}
	return m, true
}

// decode reads one record, carved from slab; nil when it stopped at a
// refusal.
func (p *avroPlan) decode(r *avro.Reader, slab *partial.Slab) *partial.Fields {
	m := slab.Fields(p.names, p.index)
	for i := range p.fields {
		f := &p.fields[i]
		switch {
		case !f.read:
			if !skipAvro(r, f.typ) {
				return nil
			}
		case f.sub != nil:
			v := f.sub.decode(r, slab)
			if v == nil {
				return nil
			}
			m.Vals[f.slot] = v
		default:
			v, ok := readAvro(r, f.typ)
			if !ok {
				return nil
			}
			m.Vals[f.slot] = v
		}
		if r.Error != nil {
			return nil
		}
	}
	return m
}

// readAvro builds one value of sc as decodeAvro gives it: the common
// primitives directly, with the Reader calls hamba's decoders make for
// them, anything else through ReadVal and avroValue.
func readAvro(r *avro.Reader, sc avro.Schema) (any, bool) {
	if ps, ok := sc.(*avro.PrimitiveSchema); ok && ps.Logical() == nil {
		switch ps.Type() {
		case avro.Boolean:
			return r.ReadBool(), r.Error == nil
		case avro.Int:
			return int64(r.ReadInt()), r.Error == nil
		case avro.Long:
			return r.ReadLong(), r.Error == nil
		case avro.Float:
			return float64(r.ReadFloat()), r.Error == nil
		case avro.Double:
			return r.ReadDouble(), r.Error == nil
		case avro.String:
			return r.ReadString(), r.Error == nil
		case avro.Null:
			return nil, true
		}
	}
	var v any
	r.ReadVal(sc, &v)
	if r.Error != nil {
		return nil, false
	}
	return avroValue(sc, v), true
}

// skipAvro passes one value of sc, checking it as decoding it would:
// false (or r.Error set) when the whole decode could refuse it.
func skipAvro(r *avro.Reader, sc avro.Schema) bool {
	switch sc.Type() {
	case avro.Null:
		return true
	case avro.Boolean:
		r.ReadBool()
	case avro.Int:
		r.ReadInt()
	case avro.Long:
		r.ReadLong()
	case avro.Float:
		r.SkipNBytes(4)
	case avro.Double:
		r.SkipNBytes(8)
	case avro.String, avro.Bytes:
		return skipAvroBytes(r)
	case avro.Fixed:
		r.SkipNBytes(sc.(*avro.FixedSchema).Size())
	case avro.Enum:
		i := r.ReadInt()
		if i < 0 || int(i) >= len(sc.(*avro.EnumSchema).Symbols()) {
			return false
		}
	case avro.Union:
		types := sc.(*avro.UnionSchema).Types()
		i := r.ReadInt()
		if r.Error != nil || i < 0 || int(i) >= len(types) {
			return false
		}
		return skipAvro(r, types[i])
	case avro.Record:
		for _, f := range sc.(*avro.RecordSchema).Fields() {
			if !skipAvro(r, f.Type()) || r.Error != nil {
				return false
			}
		}
	case avro.Ref:
		return skipAvro(r, sc.(*avro.RefSchema).Schema())
	case avro.Array:
		items := sc.(*avro.ArraySchema).Items()
		size := int64(0)
		for {
			n, _ := r.ReadBlockHeader()
			if r.Error != nil || n < 0 {
				return false
			}
			if n == 0 {
				break
			}
			if size += n; size > maxAvroElements {
				return false // the whole decode's MaxSliceAllocSize
			}
			for range n {
				if !skipAvro(r, items) || r.Error != nil {
					return false
				}
			}
		}
	case avro.Map:
		values := sc.(*avro.MapSchema).Values()
		for {
			n, _ := r.ReadBlockHeader()
			if r.Error != nil || n < 0 {
				return false
			}
			if n == 0 {
				break
			}
			for range n {
				if !skipAvroBytes(r) || !skipAvro(r, values) || r.Error != nil {
					return false
				}
			}
		}
	default:
		return false
	}
	return r.Error == nil
}

// skipAvroBytes passes a string or bytes value with the checks of
// hamba's readBytes: a negative length, or one above avroAPI's
// MaxByteSliceSize, is refused.
func skipAvroBytes(r *avro.Reader) bool {
	n := r.ReadLong()
	if r.Error != nil || n < 0 || n > maxAvroBytes {
		return false
	}
	r.SkipNBytes(int(n))
	return r.Error == nil
}
