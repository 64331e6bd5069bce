package pipeline

import (
	"slices"

	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
)

// fieldTree is the part of a record value that the expressions of a topic
// read, learnt from their checked ASTs at compile time (readsOf): a node
// is read whole, or only at the keys of its kids. The JSON decoder builds
// only that part (decodePartial); whatever the expressions do with it,
// they meet the same values as in the whole document, since they reach
// the value only through these paths.
//
// The root read whole (the zero tree marked whole) means "decode
// everything": an expression uses value other than through a chain of
// constant field names (passes it to a function, indexes it with a
// computed key, iterates it, compares it...).
type fieldTree struct {
	whole bool
	kids  map[string]*fieldTree
	// order is kids in the order they were added; a kid's idx is its
	// place there, and its value's in the objects the decoder builds.
	order []*fieldTree
	idx   int
	// name is the node's key in its parent's kids, which the decoder
	// stores in the maps it builds instead of a copy of the document's.
	name string
}

// kid is the kid at key name, or nil. A node read at a few keys, as most
// are, compares them in turn, which is faster than hashing name.
func (t *fieldTree) kid(name string) *fieldTree {
	if len(t.order) <= 8 {
		for _, k := range t.order {
			if k.name == name {
				return k
			}
		}
		return nil
	}
	return t.kids[name]
}

// add marks path read whole; a nil path is the whole value. A path below
// a node read whole adds nothing; a node read whole forgets its kids.
func (t *fieldTree) add(path []string) {
	n := t
	for _, name := range path {
		if n.whole {
			return
		}
		if n.kids == nil {
			n.kids = map[string]*fieldTree{}
		}
		k := n.kids[name]
		if k == nil {
			k = &fieldTree{name: name, idx: len(n.order)}
			n.kids[name] = k
			n.order = append(n.order, k)
		}
		n = k
	}
	n.whole, n.kids, n.order = true, nil, nil
}

// paths lists the paths read whole, for tests and messages: "a.b",
// and "" for the whole value.
func (t *fieldTree) paths() []string {
	var out []string
	var walk func(n *fieldTree, prefix string)
	walk = func(n *fieldTree, prefix string) {
		if n.whole {
			out = append(out, prefix)
			return
		}
		for name, k := range n.kids {
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			walk(k, p)
		}
	}
	walk(t, "")
	return out
}

// readsOf adds to t what the expression e reads of the variable value.
// It is conservative: every use of value that is not a chain of constant
// field names (value.a.b, value["a"], value.?a, has(value.a)) reads the
// whole of where the chain stops: value.items[0] reads value.items,
// size(value) and value[k] read all of value. A comprehension that names
// a variable value (shadowing the record's) reads all of value too.
func readsOf(e celast.Expr, t *fieldTree) {
	if path, ok := valuePath(e); ok {
		t.add(path)
		return
	}
	switch e.Kind() {
	case celast.SelectKind:
		readsOf(e.AsSelect().Operand(), t)
	case celast.CallKind:
		c := e.AsCall()
		if c.IsMemberFunction() {
			readsOf(c.Target(), t)
		}
		for _, a := range c.Args() {
			readsOf(a, t)
		}
	case celast.ComprehensionKind:
		c := e.AsComprehension()
		if isValue(c.IterVar()) || isValue(c.IterVar2()) || isValue(c.AccuVar()) {
			t.add(nil)
		}
		for _, x := range []celast.Expr{c.IterRange(), c.AccuInit(), c.LoopCondition(), c.LoopStep(), c.Result()} {
			readsOf(x, t)
		}
	case celast.ListKind:
		for _, x := range e.AsList().Elements() {
			readsOf(x, t)
		}
	case celast.MapKind:
		for _, en := range e.AsMap().Entries() {
			me := en.AsMapEntry()
			readsOf(me.Key(), t)
			readsOf(me.Value(), t)
		}
	case celast.StructKind:
		for _, f := range e.AsStruct().Fields() {
			readsOf(f.AsStructField().Value(), t)
		}
	}
}

// isValue reports whether an identifier names the variable value (also
// as the root-qualified .value).
func isValue(name string) bool { return name == "value" || name == ".value" }

// valuePath returns the field names of e when e is value itself or a
// chain of constant field names on it: value.a.b, value["a"].b,
// value.?a, value[?"a"] (has(value.a) is value.a, test only). It returns
// false for anything else.
func valuePath(e celast.Expr) ([]string, bool) {
	switch e.Kind() {
	case celast.IdentKind:
		return nil, isValue(e.AsIdent())
	case celast.SelectKind:
		s := e.AsSelect()
		p, ok := valuePath(s.Operand())
		if !ok {
			return nil, false
		}
		return append(p, s.FieldName()), true
	case celast.CallKind:
		c := e.AsCall()
		switch c.FunctionName() {
		case operators.Index, operators.OptIndex, operators.OptSelect:
		default:
			return nil, false
		}
		args := c.Args()
		if c.IsMemberFunction() || len(args) != 2 || args[1].Kind() != celast.LiteralKind {
			return nil, false
		}
		name, ok := args[1].AsLiteral().(types.String)
		if !ok {
			return nil, false // value.items[0]: the list is read whole
		}
		p, ok := valuePath(args[0])
		if !ok {
			return nil, false
		}
		return append(p, string(name)), true
	}
	return nil, false
}

// ReadPaths returns the paths of value that the expressions of topic's
// pipelines read, each a list of field names, for the decoders of other
// formats (Avro, Protobuf) to build only those: ok is false when they
// need the whole value (an expression uses value as a whole) or no
// pipeline reads topic. An empty list with ok says nothing of value is
// read. Every path is read whole; none is a prefix of another.
func (s *Set) ReadPaths(topic string) (paths [][]string, ok bool) {
	t := s.reads[topic]
	if t == nil || t.whole {
		return nil, false
	}
	paths = [][]string{}
	var walk func(n *fieldTree, prefix []string)
	walk = func(n *fieldTree, prefix []string) {
		if n.whole {
			paths = append(paths, slices.Clone(prefix))
			return
		}
		for name, k := range n.kids {
			walk(k, append(prefix, name))
		}
	}
	walk(t, nil)
	return paths, true
}
