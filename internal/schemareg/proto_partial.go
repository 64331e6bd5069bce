package schemareg

import (
	"math"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"ratchet/internal/partial"
)

// protoPlan is how to decode one message type for one reads tree. The
// fields read are of three kinds. A direct field (a singular scalar
// outside any oneof) is decoded from the wire as proto.Unmarshal does:
// the last occurrence of the right wire type wins, one of another wire
// type is an unknown field. A nested field (a singular message outside
// any oneof, read at some of its fields, or a Timestamp or Duration) has
// its occurrences merged as proto.Unmarshal merges them: decoding the
// concatenation of their bodies, with a plan of its own. Every other read
// field (a message read whole, repeated fields and maps, oneof members,
// which clear each other) is collected: its occurrences, in order, are
// unmarshalled into a dynamicpb message of the type, with the other
// members of its oneof, which gives that field the very state the whole
// message would have, and its value is built from that as protoMessage
// builds it. Unread fields are checked as proto.Unmarshal checks them,
// and skipped.
type protoPlan struct {
	md protoreflect.MessageDescriptor
	// fields are the message's fields by number, each with its action
	// when read: an index into direct (>= 0), collect, or nestedAction(i)
	// for nested[i]. A number not there is an unknown field.
	fields    map[protowire.Number]planField
	direct    []*fieldInfo
	nested    []nestedField
	collected []collectedField
	// wkt is set on the plan of a Timestamp or a Duration, whose value
	// is made from its seconds and nanos (direct[0] and direct[1]).
	wkt protoreflect.FullName
	// names are the keys of the decoded value, a partial.Fields: direct,
	// then collected, then nested fields, each in its list's order.
	names []string
	index map[string]int
}

type planField struct {
	info   *fieldInfo
	read   bool
	action int
}

// fieldInfo is what the partial decode needs of a field, taken from its
// descriptor once (descriptor calls are slow on the hot path).
type fieldInfo struct {
	fd       protoreflect.FieldDescriptor
	kind     protoreflect.Kind
	name     string
	want     protowire.Type // the wire type of one value (bytes for maps)
	packable bool           // a repeated field of a scalar numeric kind
	// msg checks a message value (or a map entry); nil for scalars.
	msg *msgInfo
	// def is the value protoMessage gives when the field is absent.
	def any
}

// msgInfo is the fieldInfo of a message's fields by number.
type msgInfo struct {
	fields map[protowire.Number]*fieldInfo
}

// infoOf builds the msgInfo of md and the messages it reaches, once each
// (seen).
func infoOf(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*msgInfo) *msgInfo {
	if mi := seen[md.FullName()]; mi != nil {
		return mi
	}
	mi := &msgInfo{fields: map[protowire.Number]*fieldInfo{}}
	seen[md.FullName()] = mi
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		fi := &fieldInfo{fd: fd, kind: fd.Kind(), name: string(fd.Name())}
		fi.want, fi.packable = wireOf(fi.kind)
		fi.packable = fi.packable && fd.IsList()
		if fd.IsMap() {
			fi.want = protowire.BytesType
		}
		if m := fd.Message(); m != nil {
			fi.msg = infoOf(m, seen)
		}
		if !fd.IsList() && !fd.IsMap() && fd.Message() == nil {
			fi.def = protoField(fd, fd.Default())
		}
		mi.fields[fd.Number()] = fi
	}
	return mi
}

type nestedField struct {
	fd  protoreflect.FieldDescriptor
	sub *protoPlan
}

type collectedField struct {
	fd protoreflect.FieldDescriptor
	t  *reads
}

// collect is the action of a collected field; nestedAction(i) that of
// nested[i].
const collect = -1

func nestedAction(i int) int { return -2 - i }

// maxProtoDepth bounds the nesting the partial decode checks; a deeper
// message goes to the whole decode (whose bound is 10000).
const maxProtoDepth = 100

// newProtoPlan plans md for t, or returns nil when the partial decode
// does not apply: md is not a proto3 message with all the messages it
// reaches proto3 too (so no required fields, groups, extensions or
// message sets), or it is a message protoMessage does not turn into a
// map (Timestamp, Duration, wrappers).
func newProtoPlan(md protoreflect.MessageDescriptor, t *reads) *protoPlan {
	if !allProto3(md, map[protoreflect.FullName]bool{}) || wellKnown(md.FullName()) {
		return nil
	}
	return planMessage(md, t, map[protoreflect.FullName]*msgInfo{})
}

func planMessage(md protoreflect.MessageDescriptor, t *reads, seen map[protoreflect.FullName]*msgInfo) *protoPlan {
	mi := infoOf(md, seen)
	p := &protoPlan{md: md, fields: make(map[protowire.Number]planField, len(mi.fields))}
	for num, fi := range mi.fields {
		p.fields[num] = planField{info: fi}
	}
	act := func(fd protoreflect.FieldDescriptor, action int) {
		p.fields[fd.Number()] = planField{info: mi.fields[fd.Number()], read: true, action: action}
	}
	fields := md.Fields()
	for name, k := range t.kids {
		fd := fields.ByName(protoreflect.Name(name))
		if fd == nil {
			continue // the whole decode has no such key either
		}
		singular := fd.ContainingOneof() == nil && !fd.IsList() && !fd.IsMap()
		switch {
		case singular && fd.Message() == nil:
			act(fd, len(p.direct))
			p.direct = append(p.direct, mi.fields[fd.Number()])
			continue
		case singular && isTime(fd.Message().FullName()):
			act(fd, nestedAction(len(p.nested)))
			p.nested = append(p.nested, nestedField{fd: fd, sub: timePlan(fd.Message(), seen)})
			continue
		case singular && !k.whole && !wellKnown(fd.Message().FullName()):
			act(fd, nestedAction(len(p.nested)))
			p.nested = append(p.nested, nestedField{fd: fd, sub: planMessage(fd.Message(), k, seen)})
			continue
		}
		p.collected = append(p.collected, collectedField{fd: fd, t: k})
		act(fd, collect)
		if o := fd.ContainingOneof(); o != nil {
			for i := range o.Fields().Len() {
				act(o.Fields().Get(i), collect)
			}
		}
	}
	for _, fi := range p.direct {
		p.names = append(p.names, fi.name)
	}
	for _, c := range p.collected {
		p.names = append(p.names, string(c.fd.Name()))
	}
	for _, nf := range p.nested {
		p.names = append(p.names, string(nf.fd.Name()))
	}
	p.index = partial.Index(p.names)
	return p
}

// isTime reports the messages protoMessage makes a time.Time or a
// time.Duration of.
func isTime(n protoreflect.FullName) bool {
	return n == "google.protobuf.Timestamp" || n == "google.protobuf.Duration"
}

// timePlan reads seconds and nanos of a Timestamp or a Duration.
func timePlan(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*msgInfo) *protoPlan {
	p := planMessage(md, &reads{kids: map[string]*reads{"seconds": {whole: true}, "nanos": {whole: true}}}, seen)
	p.wkt = md.FullName()
	for i, name := range []protoreflect.Name{"seconds", "nanos"} {
		fd := md.Fields().ByName(name)
		p.fields[fd.Number()] = planField{info: p.fields[fd.Number()].info, read: true, action: i}
		p.direct[i] = p.fields[fd.Number()].info
	}
	return p
}

// allProto3 reports whether md and every message its fields reach are of
// proto3 files.
func allProto3(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return true
	}
	seen[md.FullName()] = true
	if md.ParentFile() == nil || md.ParentFile().Syntax() != protoreflect.Proto3 || md.ExtensionRanges().Len() > 0 {
		return false
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Kind() == protoreflect.GroupKind || fd.Cardinality() == protoreflect.Required {
			return false
		}
		if m := fd.Message(); m != nil && !allProto3(m, seen) {
			return false
		}
	}
	return true
}

// wellKnown reports the messages protoMessage turns into a single value.
func wellKnown(n protoreflect.FullName) bool {
	switch n {
	case "google.protobuf.Timestamp", "google.protobuf.Duration",
		"google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
		"google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
		"google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue":
		return true
	}
	return false
}

// protoScratch is what one partition's partial protobuf decode reuses:
// the occurrences of collected fields.
type protoScratch struct {
	buf []byte
	// slab is the partition's (ValueDecoder.slab): the decoded values
	// are carved from it.
	slab *partial.Slab
}

type protoSlot struct {
	set bool
	v   any
}

// nestedBody is the merged body of a nested field: the body of its only
// occurrence, or the concatenation of them all (owned).
type nestedBody struct {
	set   bool
	owned bool
	b     []byte
}

// decodeProtoPartial decodes payload as p's message as decodeProtobuf
// does, but builds only the fields p reads. ok is false when it does not
// accept the payload (anything proto.Unmarshal might refuse, and some it
// would not: invalid UTF-8 in any string, nesting deeper than
// maxProtoDepth): the caller then runs the whole decode, which decides.
func decodeProtoPartial(p *protoPlan, sc *protoScratch, payload []byte) (*partial.Fields, bool) {
	v, ok := p.decode(sc, payload, 1)
	if !ok {
		return nil, false
	}
	return v.(*partial.Fields), true
}

// decode decodes one message of p's type from b (at nesting depth): a
// partial.Fields of p.names, or for a Timestamp or Duration plan its time
// value.
func (p *protoPlan) decode(sc *protoScratch, b []byte, depth int) (any, bool) {
	var slotsBuf [8]protoSlot
	slots := slotsBuf[:0]
	if len(p.direct) <= len(slotsBuf) {
		slots = slotsBuf[:len(p.direct)]
	} else {
		slots = make([]protoSlot, len(p.direct))
	}
	var nestedBuf [4]nestedBody
	bodies := nestedBuf[:0]
	if len(p.nested) <= len(nestedBuf) {
		bodies = nestedBuf[:len(p.nested)]
	} else {
		bodies = make([]nestedBody, len(p.nested))
	}
	if len(p.collected) > 0 {
		sc.buf = sc.buf[:0]
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return nil, false
		}
		tag := b[:n]
		b = b[n:]
		pf := p.fields[num]
		a := pf.action
		switch {
		case !pf.read || a == collect:
			m := protoValidField(pf.info, num, typ, b, depth)
			if m < 0 {
				return nil, false
			}
			if pf.read {
				sc.buf = append(append(sc.buf, tag...), b[:m]...)
			}
			b = b[m:]
		case a >= 0:
			v, m, ok := protoScalar(p.direct[a], typ, b)
			if m < 0 {
				return nil, false
			}
			if ok {
				slots[a] = protoSlot{set: true, v: v}
			}
			b = b[m:]
		default:
			i := -2 - a
			if typ != protowire.BytesType {
				m := protowire.ConsumeFieldValue(num, typ, b) // an unknown field
				if m < 0 {
					return nil, false
				}
				b = b[m:]
				continue
			}
			x, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false
			}
			nb := &bodies[i]
			switch {
			case !nb.set:
				*nb = nestedBody{set: true, b: x}
			case !nb.owned:
				nb.b = append(append([]byte{}, nb.b...), x...)
				nb.owned = true
			default:
				nb.b = append(nb.b, x...)
			}
			b = b[m:]
		}
	}
	if p.wkt != "" {
		sec, nanos := int64(0), int64(0)
		if slots[0].set {
			sec = slots[0].v.(int64)
		}
		if slots[1].set {
			nanos = slots[1].v.(int64)
		}
		if p.wkt == "google.protobuf.Timestamp" {
			return time.Unix(sec, nanos).UTC(), true
		}
		return time.Duration(sec)*time.Second + time.Duration(nanos), true
	}
	out := sc.slab.Fields(p.names, p.index)
	for i, fi := range p.direct {
		if slots[i].set {
			out.Vals[i] = slots[i].v
		} else {
			out.Vals[i] = fi.def // direct fields of proto3 have no presence
		}
	}
	col := out.Vals[len(p.direct) : len(p.direct)+len(p.collected)]
	if len(p.collected) > 0 {
		m := dynamicpb.NewMessage(p.md)
		if err := proto.Unmarshal(sc.buf, m); err != nil {
			return nil, false
		}
		for j, c := range p.collected {
			col[j] = partial.Absent
			if v, ok := protoPartialField(m, c.fd, c.t); ok {
				col[j] = v
			}
		}
	}
	nested := out.Vals[len(p.direct)+len(p.collected):]
	for i, nf := range p.nested {
		if !bodies[i].set {
			nested[i] = partial.Absent // an unset message has no key
			continue
		}
		if depth >= maxProtoDepth {
			return nil, false
		}
		v, ok := nf.sub.decode(sc, bodies[i].b, depth+1)
		if !ok {
			return nil, false
		}
		nested[i] = v
	}
	return out, true
}

// protoPartialField is the value of fd in m as protoMessage gives it,
// of a message read at some fields only those; ok is false when
// protoMessage gives no key for it (an unset message or oneof member).
func protoPartialField(m protoreflect.Message, fd protoreflect.FieldDescriptor, t *reads) (any, bool) {
	if (fd.Message() != nil && !fd.IsList() && !fd.IsMap() || fd.ContainingOneof() != nil || fd.HasPresence()) && !m.Has(fd) {
		return nil, false
	}
	v := m.Get(fd)
	switch {
	case fd.IsList():
		l := v.List()
		items := make([]any, l.Len())
		for j := range l.Len() {
			items[j] = protoField(fd, l.Get(j))
		}
		return items, true
	case fd.IsMap():
		mm := make(map[string]any, v.Map().Len())
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			mm[k.String()] = protoField(fd.MapValue(), mv)
			return true
		})
		return mm, true
	case fd.Message() != nil && !t.whole && !wellKnown(fd.Message().FullName()):
		sub := v.Message()
		fields := sub.Descriptor().Fields()
		out := make(map[string]any, len(t.kids))
		for name, k := range t.kids {
			if kfd := fields.ByName(protoreflect.Name(name)); kfd != nil {
				if kv, ok := protoPartialField(sub, kfd, k); ok {
					out[name] = kv
				}
			}
		}
		return out, true
	}
	return protoField(fd, v), true
}

// protoScalar decodes one occurrence of the singular scalar field fd of
// wire type typ at b as proto.Unmarshal does: n is the length consumed
// (negative when the wire is malformed or a string is not valid UTF-8),
// ok false when the wire type is not fd's, which makes it an unknown
// field that leaves fd as it is.
func protoScalar(fi *fieldInfo, typ protowire.Type, b []byte) (v any, n int, ok bool) {
	if typ != fi.want {
		n = protowire.ConsumeFieldValue(fi.fd.Number(), typ, b)
		return nil, n, false
	}
	switch typ {
	case protowire.VarintType:
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, n, false
		}
		switch fi.kind {
		case protoreflect.BoolKind:
			return protowire.DecodeBool(x), n, true
		case protoreflect.Int32Kind:
			return int64(int32(x)), n, true
		case protoreflect.Sint32Kind:
			return int64(int32(protowire.DecodeZigZag(x & math.MaxUint32))), n, true
		case protoreflect.Int64Kind:
			return int64(x), n, true
		case protoreflect.Sint64Kind:
			return protowire.DecodeZigZag(x), n, true
		case protoreflect.Uint32Kind:
			return uint64(uint32(x)), n, true
		case protoreflect.Uint64Kind:
			return x, n, true
		case protoreflect.EnumKind:
			return protoField(fi.fd, protoreflect.ValueOfEnum(protoreflect.EnumNumber(x))), n, true
		}
	case protowire.Fixed32Type:
		x, n := protowire.ConsumeFixed32(b)
		if n < 0 {
			return nil, n, false
		}
		switch fi.kind {
		case protoreflect.Sfixed32Kind:
			return int64(int32(x)), n, true
		case protoreflect.Fixed32Kind:
			return uint64(x), n, true
		case protoreflect.FloatKind:
			return float64(math.Float32frombits(x)), n, true
		}
	case protowire.Fixed64Type:
		x, n := protowire.ConsumeFixed64(b)
		if n < 0 {
			return nil, n, false
		}
		switch fi.kind {
		case protoreflect.Sfixed64Kind:
			return int64(x), n, true
		case protoreflect.Fixed64Kind:
			return x, n, true
		case protoreflect.DoubleKind:
			return math.Float64frombits(x), n, true
		}
	case protowire.BytesType:
		x, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, n, false
		}
		switch fi.kind {
		case protoreflect.StringKind:
			if !utf8.Valid(x) {
				return nil, -1, false
			}
			return string(x), n, true
		case protoreflect.BytesKind:
			return append([]byte{}, x...), n, true
		}
	}
	return nil, -1, false // not a kind of a direct field
}

// wireOf is the wire type of a singular value of kind k, and whether a
// repeated field of k may be packed.
func wireOf(k protoreflect.Kind) (protowire.Type, bool) {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Sint32Kind,
		protoreflect.Uint32Kind, protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType, true
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type, true
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type, true
	case protoreflect.GroupKind:
		return protowire.StartGroupType, false
	}
	return protowire.BytesType, false // strings, bytes, messages
}

// protoValidField checks the value of field num (fd, nil when unknown) of
// wire type typ at b as proto.Unmarshal would when decoding it, and
// returns its length, negative when proto.Unmarshal might refuse it. A
// value of a wire type fd does not take is an unknown field: only its
// wire is checked.
func protoValidField(fi *fieldInfo, num protowire.Number, typ protowire.Type, b []byte, depth int) int {
	if fi == nil {
		return protowire.ConsumeFieldValue(num, typ, b)
	}
	if fi.packable && typ == protowire.BytesType {
		x, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return n
		}
		for len(x) > 0 {
			var m int
			switch fi.want {
			case protowire.VarintType:
				_, m = protowire.ConsumeVarint(x)
			case protowire.Fixed32Type:
				_, m = protowire.ConsumeFixed32(x)
			default:
				_, m = protowire.ConsumeFixed64(x)
			}
			if m < 0 {
				return m
			}
			x = x[m:]
		}
		return n
	}
	if typ != fi.want || typ != protowire.BytesType {
		return protowire.ConsumeFieldValue(num, typ, b)
	}
	x, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n
	}
	switch {
	case fi.msg != nil: // a message, or a map's entry: key 1, value 2
		if depth >= maxProtoDepth || !protoValid(fi.msg, x, depth+1) {
			return -1
		}
	case fi.kind == protoreflect.StringKind:
		if !utf8.Valid(x) {
			return -1
		}
	}
	return n
}

// protoValid checks a message of md as proto.Unmarshal would decode it.
func protoValid(mi *msgInfo, b []byte, depth int) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return false
		}
		b = b[n:]
		m := protoValidField(mi.fields[num], num, typ, b, depth)
		if m < 0 {
			return false
		}
		b = b[m:]
	}
	return true
}
