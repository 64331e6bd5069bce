// Package partial holds what a record value decodes to when only some of
// its fields are built: the fields the expressions of its topic's
// pipelines read.
package partial

import (
	"unsafe"
	"weak"
)

// Fields is an Avro record or a protobuf message decoded at some of its
// fields: Vals[i] is the value of Names[i], or Absent when the value has
// none (an unset protobuf message field). It stands for the
// map[string]any of those fields that the whole decode gives, and reads
// the same (Get, Plain), without the map's table of eight slots and its
// hash of each key; carved from a Slab, it costs no allocation of its
// own.
type Fields struct {
	// Names are the field names of the plan that decoded the value,
	// shared by every value it decodes.
	Names []string
	Vals  []any
	// index finds a name among many (the plan's, shared); nil for a few.
	index map[string]int
}

type absentField struct{}

// Absent is the value of a field the decoded value does not have.
var Absent any = absentField{}

// Index is what Slab.Fields takes to find a name among Names: nil for a few
// names (compared in turn), a map for more.
func Index(names []string) map[string]int {
	if len(names) <= 8 {
		return nil
	}
	m := make(map[string]int, len(names))
	for i, n := range names {
		m[n] = i
	}
	return m
}

// Chunks hands out slots of T carved from chunks of a fixed size, so that the
// values a partition decodes cost an allocation a chunk rather than one
// each. Slots are never handed out twice. Chunks holds its current chunk
// only weakly: a chunk lives while a slot of it is reachable, and not for
// the carver's sake, so a partition whose records are applied and dropped
// keeps none of their values (a JSON string shares its record's bytes; an
// idle partition must not hold them). Chunks is for one goroutine (a
// partition's decoder); its zero value is ready.
type Chunks[T any] struct {
	first weak.Pointer[T] // the current chunk's first slot
	used  int             // of the current chunk, the slots handed out
}

// Take returns n zero slots of a chunk of size slots (the same size on
// every call), starting a chunk when the current one has no n slots left
// or nothing of it is reachable any more.
func (c *Chunks[T]) Take(n, size int) []T {
	var chunk []T
	if p := c.first.Value(); p != nil && c.used+n <= size {
		chunk = unsafe.Slice(p, size)
	} else {
		chunk = make([]T, size)
		c.first, c.used = weak.Make(&chunk[0]), 0
	}
	s := chunk[c.used : c.used+n : c.used+n]
	c.used += n
	return s
}

// Slab carves Fields and value slices out of Chunks. The nil *Slab
// allocates every value on its own.
type Slab struct {
	fields Chunks[Fields]
	vals   Chunks[any]
}

const (
	fieldsChunk = 64  // Fields a chunk: 3.5 KiB
	valsChunk   = 256 // values a chunk: 4 KiB
)

// Vals returns n nil values.
func (s *Slab) Vals(n int) []any {
	if s == nil || n > valsChunk/4 {
		return make([]any, n) // a wide value has a slice of its own
	}
	return s.vals.Take(n, valsChunk)
}

// Fields returns Fields of names (index is Index(names)), every value nil.
func (s *Slab) Fields(names []string, index map[string]int) *Fields {
	var f *Fields
	if s == nil {
		f = &Fields{}
	} else {
		f = &s.fields.Take(1, fieldsChunk)[0]
	}
	f.Names, f.index, f.Vals = names, index, s.Vals(len(names))
	return f
}

// Get is the value of field name, as the map of f's fields would give it.
func (f *Fields) Get(name string) (any, bool) {
	i := -1
	if f.index != nil {
		if j, ok := f.index[name]; ok {
			i = j
		}
	} else {
		for j, n := range f.Names {
			if n == name {
				i = j
				break
			}
		}
	}
	if i < 0 {
		return nil, false
	}
	v := f.Vals[i]
	return v, v != Absent
}

// Plain is v with every Fields in it (at any depth of Fields) made the
// map[string]any of its fields that have a value: what the whole decode
// gives, projected on the fields read.
func Plain(v any) any {
	f, ok := v.(*Fields)
	if !ok {
		return v
	}
	m := make(map[string]any, len(f.Vals))
	for i, name := range f.Names {
		if e := f.Vals[i]; e != Absent {
			m[name] = Plain(e)
		}
	}
	return m
}
