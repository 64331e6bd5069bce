package pipeline

import (
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/overloads"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"

	"ratchet/internal/partial"
)

// form is an expression of a shape common in pipelines that is evaluated
// without the interpreter when the record allows (see form.eval): a field
// path of value (value.a.b), a field of record (record.key,
// record.timestamp, record.topic, record.partition, record.offset), a
// conversion of one of these (double(value.amount), int(value.items),
// string(record.key)), or one of these compared with a literal
// (value.status != "test"). The interpreter costs about 1 µs and several
// allocations per evaluation even for these, and building the record
// variable it reads record from costs as much again.
//
// A form gives exactly what the interpreter gives, or declines: wherever
// the interpreter's answer could differ or be an error (a key that is
// absent, an operand of a type no overload of the conversion takes, a
// conversion that fails), it declines and the interpreter decides, so
// every error keeps its text.
type form struct {
	path   []string // a field path of value
	record string   // a field of record
	// fn converts (double, int, string) or compares (operators.Equals,
	// operators.NotEquals) arg; a comparison's other side is lit.
	fn  string
	arg *form
	lit ref.Val
}

// formOf returns the form of e, or nil when e has none.
func formOf(e celast.Expr) *form {
	switch e.Kind() {
	case celast.SelectKind:
		s := e.AsSelect()
		if s.IsTestOnly() {
			return nil
		}
		op := s.Operand()
		if op.Kind() == celast.IdentKind && op.AsIdent() == "record" {
			switch s.FieldName() {
			case "key", "timestamp", "topic", "partition", "offset":
				return &form{record: s.FieldName()}
			}
			return nil
		}
		if p := valueSelects(e); p != nil {
			return &form{path: p}
		}
	case celast.CallKind:
		c := e.AsCall()
		if c.IsMemberFunction() {
			return nil
		}
		args := c.Args()
		switch fn := c.FunctionName(); fn {
		case overloads.TypeConvertDouble, overloads.TypeConvertInt, overloads.TypeConvertString:
			if len(args) != 1 {
				return nil
			}
			if arg := formOf(args[0]); arg != nil && arg.fn == "" {
				return &form{fn: fn, arg: arg}
			}
		case operators.Equals, operators.NotEquals:
			if len(args) != 2 {
				return nil
			}
			l, r := args[0], args[1]
			if l.Kind() == celast.LiteralKind {
				l, r = r, l
			}
			if r.Kind() != celast.LiteralKind {
				return nil
			}
			lit := r.AsLiteral()
			switch lit.(type) {
			case types.String, types.Int, types.Uint, types.Double, types.Bool, types.Null:
			default:
				return nil
			}
			if arg := formOf(l); arg != nil && arg.fn != operators.Equals && arg.fn != operators.NotEquals {
				return &form{fn: fn, arg: arg, lit: lit}
			}
		}
	}
	return nil
}

// valueSelects returns the field names of e when e is value.a.b... (one
// field at least), else nil.
func valueSelects(e celast.Expr) []string {
	var rev []string
	for e.Kind() == celast.SelectKind {
		s := e.AsSelect()
		if s.IsTestOnly() {
			return nil
		}
		rev = append(rev, s.FieldName())
		e = s.Operand()
	}
	if len(rev) == 0 || e.Kind() != celast.IdentKind || !isValue(e.AsIdent()) {
		return nil
	}
	path := make([]string, len(rev))
	for i, name := range rev {
		path[len(rev)-1-i] = name
	}
	return path
}

// fastLen is expr.fastLen for a form of an expression bounded or not
// (its cost tracked against limit), and false when the form is not to be
// used: the interpreter charges a conversion or a comparison by the size
// of its string operand (a tenth of a unit a byte), so only an operand far
// below the cost limit is sure to stay within it.
func fastLen(bounded bool, limit uint64) (int, bool) {
	switch {
	case bounded:
		return -1, true
	case limit < 1000:
		return 0, false
	}
	return int(min(limit/100, 1<<20)), true
}

// eval evaluates f on a's record; false: the interpreter decides. maxLen
// (< 0: none) bounds the strings and bytes converted or compared.
func (f *form) eval(a *recordActivation, maxLen int) (ref.Val, bool) {
	switch {
	case f.path != nil:
		return a.path(f.path)
	case f.record != "":
		rec := a.rec
		switch f.record {
		case "key":
			key := rec.Key
			if key == nil {
				key = []byte{}
			}
			return types.Bytes(key), true
		case "timestamp":
			return types.Timestamp{Time: rec.Timestamp}, true
		case "topic":
			return types.String(rec.Topic), true
		case "partition":
			return types.Int(int64(rec.Partition)), true
		case "offset":
			return types.Int(rec.Offset), true
		}
		return nil, false
	}
	v, ok := f.arg.eval(a, maxLen)
	if !ok {
		return nil, false
	}
	switch x := v.(type) {
	case types.String:
		if maxLen >= 0 && len(x) > maxLen {
			return nil, false
		}
	case types.Bytes:
		if maxLen >= 0 && len(x) > maxLen {
			return nil, false
		}
	}
	switch f.fn {
	case operators.Equals:
		return types.Equal(v, f.lit), true
	case operators.NotEquals:
		return types.Bool(types.Equal(v, f.lit) != types.True), true
	}
	var to ref.Type
	// The operand types each conversion has an overload for (cel-go's
	// standard library); any other is the interpreter's "no such
	// overload".
	switch f.fn {
	case overloads.TypeConvertDouble:
		switch v.(type) {
		case types.Double:
			return v, true
		case types.Int, types.Uint, types.String:
			to = types.DoubleType
		}
	case overloads.TypeConvertInt:
		switch v.(type) {
		case types.Int:
			return v, true
		case types.Double, types.Duration, types.String, types.Timestamp, types.Uint:
			to = types.IntType
		}
	case overloads.TypeConvertString:
		switch v.(type) {
		case types.String:
			return v, true
		case types.Bool, types.Bytes, types.Double, types.Duration, types.Int, types.Timestamp, types.Uint:
			to = types.StringType
		}
	}
	if to == nil {
		return nil, false
	}
	out := v.ConvertToType(to)
	if types.IsUnknownOrError(out) {
		return nil, false // the interpreter words the error
	}
	return out, true
}

// native returns what a field path of value gives a column of kind k,
// straight from the decoded document, when that is exactly what the
// column takes of the path's CEL value (wireKind.value): a string for a
// text or varchar column, a float64 for a float one, an int64 for an
// integer one, a bool for a boolean one. The document's own interface
// value is reused, so nothing is allocated. It returns false for
// anything else: the value then goes through CEL's.
func (e *expr) native(act interpreter.Activation, k wireKind) (any, bool) {
	if e.form == nil || e.form.path == nil {
		return nil, false
	}
	a, ok := act.(*recordActivation)
	if !ok || a.value == nil {
		return nil, false
	}
	cur := a.value
	for _, name := range e.form.path {
		if cur, ok = field(cur, name); !ok {
			return nil, false
		}
	}
	switch cur.(type) {
	case string:
		ok = k == wireString
	case float64:
		ok = k == wireFloat
	case int64:
		ok = k == wireInt
	case bool:
		ok = k == wireBool
	default:
		ok = false
	}
	return cur, ok
}

// field is the value at key name of a decoded JSON or Avro map, a partly
// decoded JSON object, or an Avro record or protobuf message decoded at
// some fields (partial.Fields); false when the key is absent or v is none
// of them.
func field(v any, name string) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		f, ok := x[name]
		return f, ok
	case *object:
		return x.get(name)
	case *partial.Fields:
		return x.Get(name)
	}
	return nil, false
}
