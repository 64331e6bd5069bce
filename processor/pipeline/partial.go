package pipeline

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"ratchet/internal/partial"
)

// decodePartial decodes b as DecodeJSON does, but builds only what t
// reads: of an object read at some keys, an *object of those keys alone
// (the rest of the document is checked and skipped without allocating);
// of anything read whole, or of a value that is not an object where t
// expects one, exactly what DecodeJSON gives. The expressions, which
// reach value only through t's paths (the forms through object.get, the
// interpreter through plainValue's maps), meet the same values either
// way.
//
// It accepts only what DecodeJSON accepts: the grammar of RFC 8259 as
// encoding/json checks it, every number of the document within float64's
// range, at most maxPartialDepth levels. On anything else (a refusal, a
// framing question, a document deeper than that) it hands b to DecodeJSON
// and returns its result, so a record is refused with the same reason
// whichever decoder runs.
func decodePartial(b []byte, framed bool, t *fieldTree, objs *objects) (any, error) {
	doc := b
	if len(doc) > 0 && doc[0] == 0 {
		if !framed || len(doc) < 5 {
			return DecodeJSON(b, framed)
		}
		doc = doc[5:]
	}
	s := scanner{b: doc, objects: objs}
	s.space()
	if t == nil || t.whole || s.i >= len(s.b) || s.b[s.i] != '{' {
		return DecodeJSON(b, framed)
	}
	v, ok := s.object(t)
	if ok {
		s.space()
		ok = s.i == len(s.b)
	}
	if !ok {
		return DecodeJSON(b, framed)
	}
	return v, nil
}

// maxPartialDepth bounds the nesting decodePartial follows; a deeper
// document goes to DecodeJSON (whose own bound is 10000 levels).
const maxPartialDepth = 1000

// scanner walks one JSON document; every method returns false at the
// first byte encoding/json would refuse (or decodePartial leaves to it).
type scanner struct {
	b       []byte
	i       int
	depth   int
	objects *objects // where objects are carved from; nil: allocated each
}

// space skips JSON whitespace.
func (s *scanner) space() {
	if s.i < len(s.b) && s.b[s.i] > ' ' {
		return // compact JSON: no whitespace at all
	}
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// object is a JSON object decoded for a node of a field tree read at some
// keys: vals[i] is the value at t.order[i], or absent when the document
// has no such key. It costs one slice where a map of the same keys costs
// a table of eight slots and its hashing, and it is what most records of
// a pipeline's topic decode to.
type object struct {
	t    *fieldTree
	vals []any
}

// objects carves a partition's objects and their values out of chunks
// (partial.Chunks, as partial.Slab does Avro's and protobuf's records): an
// object costs no allocation of its own, and an idle partition keeps
// nothing of the records it applied. For one goroutine (the partition's
// decoder); the nil *objects allocates each object on its own.
type objects struct {
	objs partial.Chunks[object]
	vals partial.Slab
}

const objectsChunk = 128 // 4 KiB

// object returns an object of t, its values nil.
func (s *objects) object(t *fieldTree) *object {
	if s == nil {
		return &object{t: t, vals: make([]any, len(t.order))}
	}
	o := &s.objs.Take(1, objectsChunk)[0]
	o.t, o.vals = t, s.vals.Vals(len(t.order))
	return o
}

// absentKey is the value of a key an object's document lacks.
type absentKey struct{}

// absent marks a key an object's document lacks.
var absent any = absentKey{}

// get is the value at key name, as a map of the object's keys would give
// it.
func (o *object) get(name string) (any, bool) {
	k := o.t.kid(name)
	if k == nil {
		return nil, false
	}
	v := o.vals[k.idx]
	return v, v != absent
}

// plainValue is v with every *object in it made the map[string]any of its
// keys (those the document has), as DecodeJSON's answer projected on the
// field tree, and an Avro or protobuf partial.Fields the map of its
// fields (partial.Plain): what the CEL interpreter gets.
func plainValue(v any) any {
	o, ok := v.(*object)
	if !ok {
		return partial.Plain(v) // the Avro and protobuf form, or v itself
	}
	m := make(map[string]any, len(o.vals))
	for i, k := range o.t.order {
		if e := o.vals[i]; e != absent {
			m[k.name] = plainValue(e)
		}
	}
	return m
}

// object reads the object at s.i, building the keys t reads.
func (s *scanner) object(t *fieldTree) (*object, bool) {
	if s.depth++; s.depth > maxPartialDepth {
		return nil, false
	}
	s.i++ // '{'
	m := s.objects.object(t)
	for i := range m.vals {
		m.vals[i] = absent
	}
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return m, true
	}
	for {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return nil, false
		}
		start := s.i
		plain, ok := s.str()
		if !ok {
			return nil, false
		}
		raw := s.b[start:s.i]
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return nil, false
		}
		s.i++
		s.space()
		var kid *fieldTree
		if plain {
			kid = t.kid(unsafe.String(&raw[1], len(raw)-2))
		} else {
			name, ok := unquote(raw)
			if !ok {
				return nil, false
			}
			kid = t.kid(name)
		}
		if kid == nil {
			if !s.skip() {
				return nil, false
			}
		} else {
			var v any
			if !kid.whole && s.i < len(s.b) && s.b[s.i] == '{' {
				o, ok := s.object(kid)
				if !ok {
					return nil, false
				}
				v = o
			} else {
				vs := s.i
				if !s.skip() {
					return nil, false
				}
				if v, ok = wholeValue(s.b[vs:s.i]); !ok {
					return nil, false
				}
			}
			m.vals[kid.idx] = v // a later duplicate replaces it, as in encoding/json
		}
		s.space()
		if s.i >= len(s.b) {
			return nil, false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return m, true
		default:
			return nil, false
		}
	}
}

// skip checks and passes the value at s.i.
func (s *scanner) skip() bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.skipContainer('}', true)
	case c == '[':
		return s.skipContainer(']', false)
	case c == '"':
		_, ok := s.str()
		return ok
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || ('0' <= c && c <= '9'):
		return s.number()
	}
	return false
}

// skipContainer passes an object (keyed) or an array.
func (s *scanner) skipContainer(end byte, keyed bool) bool {
	if s.depth++; s.depth > maxPartialDepth {
		return false
	}
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == end {
		s.i++
		s.depth--
		return true
	}
	for {
		s.space()
		if keyed {
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				return false
			}
			if _, ok := s.str(); !ok {
				return false
			}
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return false
			}
			s.i++
			s.space()
		}
		if !s.skip() {
			return false
		}
		s.space()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case end:
			s.i++
			s.depth--
			return true
		default:
			return false
		}
	}
}

// literal passes true, false or null.
func (s *scanner) literal(word string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return false
	}
	s.i += len(word)
	return true
}

// str passes the string at s.i (its opening quote); plain says it holds
// no escape and is valid UTF-8, so its bytes are its text.
func (s *scanner) str() (plain, ok bool) {
	s.i++
	start := s.i
	plain, high := true, false
	for s.i < len(s.b) {
		b, i := s.b, s.i // locals: the loop keeps them in registers
		for i < len(b) && !strSpecial[b[i]] {
			i++ // the common bytes, without the cases below
		}
		s.i = i
		if s.i >= len(s.b) {
			break
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			if high && plain {
				plain = utf8.Valid(s.b[start:s.i])
			}
			s.i++
			return plain, true
		case c == '\\':
			plain = false
			if s.i+1 >= len(s.b) {
				return false, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return false, false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return false, false
					}
				}
				s.i += 6
			default:
				return false, false
			}
		case c < 0x20:
			return false, false
		default:
			if c >= utf8.RuneSelf {
				high = true
			}
			s.i++
		}
	}
	return false, false
}

// strSpecial marks the bytes of a string str must look at: its end, an
// escape, control characters, and bytes of multi-byte UTF-8.
var strSpecial = func() (t [256]bool) {
	t['"'], t['\\'] = true, true
	for c := range 0x20 {
		t[c] = true
	}
	for c := utf8.RuneSelf; c < len(t); c++ {
		t[c] = true
	}
	return t
}()

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// number passes a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
// One float64 cannot hold is refused (DecodeJSON refuses the document):
// without an exponent and with at most 308 integer digits it is below
// 1e308, in range; others are parsed to know.
func (s *scanner) number() bool {
	start := s.i
	if s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i >= len(s.b) {
		return false
	}
	intDigits := 1
	switch c := s.b[s.i]; {
	case c == '0':
		s.i++
	case '1' <= c && c <= '9':
		intDigits = digits()
	default:
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	exp := false
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		exp = true
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return false
		}
	}
	if exp || intDigits > 308 {
		b := s.b[start:s.i]
		if _, err := strconv.ParseFloat(unsafe.String(&b[0], len(b)), 64); err != nil {
			return false
		}
	}
	return true
}

// wholeValue decodes one value that skip has passed, as DecodeJSON
// decodes it.
func wholeValue(raw []byte) (any, bool) {
	switch c := raw[0]; {
	case c == '"':
		if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
			// The text as it stands in the record's value, not a copy:
			// the value is not changed after it is decoded (DecodeRecord).
			b := raw[1 : len(raw)-1]
			return unsafe.String(unsafe.SliceData(b), len(b)), true
		}
		return unquote(raw)
	case c == 't':
		return true, true
	case c == 'f':
		return false, true
	case c == 'n':
		return nil, true
	case c == '{' || c == '[':
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		if err := numbers(&v); err != nil {
			return nil, false
		}
		return v, true
	}
	v, err := numberOf(unsafe.String(&raw[0], len(raw)))
	return v, err == nil
}

// unquote is the text of a JSON string with escapes or invalid UTF-8 as
// encoding/json makes it (U+FFFD for bad bytes and lone surrogates).
func unquote(raw []byte) (string, bool) {
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false
	}
	return v, true
}
