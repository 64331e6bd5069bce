// Package partial holds what a record value decodes to when only some of
// its fields are built: the fields the expressions of its topic's
// pipelines read.
package partial

// Fields is an Avro record or a protobuf message decoded at some of its
// fields: Vals[i] is the value of Names[i], or Absent when the value has
// none (an unset protobuf message field). It stands for the
// map[string]any of those fields that the whole decode gives, and reads
// the same (Get, Plain), at one allocation for up to four fields where the
// map costs a table of eight slots and a hash a key.
type Fields struct {
	// Names are the field names of the plan that decoded the value,
	// shared by every value it decodes.
	Names []string
	Vals  []any
	// index finds a name among many (the plan's, shared); nil for a few.
	index  map[string]int
	inline [4]any
}

type absentField struct{}

// Absent is the value of a field the decoded value does not have.
var Absent any = absentField{}

// Index is what New takes to find a name among Names: nil for a few
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

// New returns Fields of names (index is Index(names)), every value nil.
func New(names []string, index map[string]int) *Fields {
	f := &Fields{Names: names, index: index}
	if len(names) <= len(f.inline) {
		f.Vals = f.inline[:len(names)]
	} else {
		f.Vals = make([]any, len(names))
	}
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
