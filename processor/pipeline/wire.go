package pipeline

import (
	"database/sql/driver"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/jackc/pgx/v5/pgtype"
)

// wireKind is how a column's values travel to PostgreSQL: as an array of
// the column's own kind of value (sent in binary, assigned without a
// parse), or as text cast to the column's type in the statement.
type wireKind int

const (
	wireText   wireKind = iota // text[], cast to the column's type (numeric, jsonb, uuid, ...)
	wireString                 // text[], assigned as is (text, varchar)
	wireInt                    // int8[] (bigint, integer, smallint: assignment casts check the range)
	wireFloat                  // float8[] (double precision, real)
	wireTime                   // timestamptz[] (timestamp with time zone)
	wireBool                   // bool[]
)

// wireOf picks the wire kind of a column of type pgType (format_type's
// spelling).
func wireOf(pgType string) wireKind {
	switch pgType {
	case "text", "character varying":
		return wireString
	case "bigint", "integer", "smallint":
		return wireInt
	case "double precision", "real":
		return wireFloat
	case "timestamp with time zone":
		return wireTime
	case "boolean":
		return wireBool
	}
	if strings.HasPrefix(pgType, "character varying(") {
		return wireString
	}
	return wireText
}

// arrayType is the parameter type of a column's array.
func (k wireKind) arrayType() string {
	switch k {
	case wireInt:
		return "int8[]"
	case wireFloat:
		return "float8[]"
	case wireTime:
		return "timestamptz[]"
	case wireBool:
		return "bool[]"
	}
	return "text[]"
}

// value converts a CEL value for a column of kind k and type pgType:
// string, int64, float64, time.Time, bool, or nil for NULL. A value that
// cannot be one is an error naming what it is. Timestamp columns take
// what toTime takes, numbers checked against b.
func (k wireKind) value(v ref.Val, pgType string, b timeBounds) (any, error) {
	if _, ok := v.(types.Null); ok {
		return nil, nil
	}
	if k == wireText && strings.HasPrefix(pgType, "timestamp") {
		// timestamp, and timestamp(p) with or without time zone: the text
		// of what toTime reads, cast by the statement.
		withZone := strings.HasSuffix(pgType, " with time zone")
		if x, ok := v.(types.String); ok && !withZone && isWallTime(string(x)) {
			return string(x), nil // a time without a zone is this column's own kind
		}
		t, err := toTime(v, b)
		if err != nil {
			return nil, fmt.Errorf("for a %s column: %w", pgType, err)
		}
		if withZone {
			return t.UTC().Format(time.RFC3339Nano), nil
		}
		return t.UTC().Format("2006-01-02 15:04:05.999999"), nil // the UTC wall time
	}
	switch k {
	case wireInt:
		switch x := v.(type) {
		case types.Int:
			return int64(x), nil
		case types.Uint:
			if uint64(x) <= math.MaxInt64 {
				return int64(x), nil
			}
		case types.Double:
			if f := float64(x); f == math.Trunc(f) && math.Abs(f) < 1<<63 {
				return int64(f), nil
			}
		case types.String:
			if n, err := strconv.ParseInt(strings.TrimSpace(string(x)), 10, 64); err == nil {
				return n, nil
			}
		}
		return nil, fmt.Errorf("%s is not an integer for a %s column", show(v), pgType)
	case wireFloat:
		switch x := v.(type) {
		case types.Int:
			return float64(x), nil
		case types.Uint:
			return float64(x), nil
		case types.Double:
			return float64(x), nil
		case types.String:
			if f, err := strconv.ParseFloat(strings.TrimSpace(string(x)), 64); err == nil {
				return f, nil
			}
		}
		return nil, fmt.Errorf("%s is not a number for a %s column", show(v), pgType)
	case wireTime:
		t, err := toTime(v, b)
		if err != nil {
			return nil, fmt.Errorf("for a %s column: %w", pgType, err)
		}
		return t, nil
	case wireBool:
		switch x := v.(type) {
		case types.Bool:
			return bool(x), nil
		case types.String:
			if b, err := strconv.ParseBool(string(x)); err == nil {
				return b, nil
			}
		}
		return nil, fmt.Errorf("%s is not a bool for a %s column", show(v), pgType)
	}
	return text(v, pgType)
}

// show renders a CEL value for an error message, shortened.
func show(v ref.Val) string {
	s := fmt.Sprintf("%v", v.Value())
	if _, ok := v.(types.String); ok {
		s = strconv.Quote(s)
	}
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return "the " + v.Type().TypeName() + " " + s
}

// numberValue converts an aggregate for a column of kind k.
func (k wireKind) numberValue(n number, pgType string) (any, error) {
	switch k {
	case wireInt:
		if n.isFloat {
			if n.f != math.Trunc(n.f) || math.Abs(n.f) >= 1<<63 {
				return nil, fmt.Errorf("%v is not an integer for a %s column", n.f, pgType)
			}
			return int64(n.f), nil
		}
		return n.i, nil
	case wireFloat:
		return n.float(), nil
	case wireTime, wireBool:
		return nil, fmt.Errorf("an aggregate cannot be written to a %s column", pgType)
	}
	return n.String(), nil
}

// keyOf appends a converted value of a column of kind k and type pgType
// to a key that ranks and orders rows, rendered so that values the column
// holds as equal render alike (PostgreSQL's equality, not Go's): -0 and 0
// in a float column, a float8 rounded to real, times to the microsecond
// pgx sends, numerics by value (1, 1.0 and 1e0; rounded to the column's
// scale), uuids in any of their spellings, character(n) without trailing
// spaces, and the spaces varchar(n) drops. Rendering two values alike
// that PostgreSQL tells apart costs nothing but one more rank; the
// statements collapse what this misses (see buildStatements).
func keyOf(b []byte, v any, k wireKind, pgType string) []byte {
	switch x := v.(type) {
	case float64:
		if pgType == "real" {
			x = float64(float32(x))
		}
		if x == 0 {
			x = 0 // -0
		}
		return keyText(b, x)
	case time.Time:
		// pgx sends floor(t / 1µs) (pgtype.Timestamptz's encoder).
		return keyText(b, x.Unix()*1_000_000+int64(x.Nanosecond())/1000)
	case string:
		return keyText(b, canonicalText(x, k, pgType))
	}
	return keyText(b, v)
}

// canonicalText is s as a column of type pgType compares it, as far as
// ratchet knows the type; s otherwise.
func canonicalText(s string, k wireKind, pgType string) string {
	switch {
	case k == wireString:
		n, ok := typmod(pgType, "character varying(")
		if !ok || utf8.RuneCountInString(s) <= n {
			return s
		}
		// Assignment drops excess characters that are all spaces.
		cut := 0
		for i := range s {
			if n == 0 {
				cut = i
				break
			}
			n--
		}
		if strings.TrimRight(s[cut:], " ") == "" {
			return s[:cut]
		}
		return s
	case k != wireText:
		return s
	case pgType == "uuid":
		t := strings.ToLower(strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}"), "-", ""))
		if len(t) == 32 && strings.Trim(t, "0123456789abcdef") == "" {
			return t
		}
	case pgType == "numeric" || strings.HasPrefix(pgType, "numeric("):
		t := strings.TrimSpace(s)
		var r big.Rat
		if strings.ContainsAny(t, "/xXoObB_") {
			return s
		}
		if _, ok := r.SetString(t); !ok {
			return strings.ToLower(t) // NaN, Infinity
		}
		if mods, ok := strings.CutPrefix(pgType, "numeric("); ok {
			if _, scale, found := strings.Cut(strings.TrimSuffix(mods, ")"), ","); found {
				if sc, err := strconv.Atoi(strings.TrimSpace(scale)); err == nil && sc >= 0 && sc < 1000 {
					roundRat(&r, sc)
				}
			}
		}
		return r.RatString()
	case pgType == "bpchar" || pgType == "character" || strings.HasPrefix(pgType, "character("):
		return strings.TrimRight(s, " ")
	}
	return s
}

// typmod returns n of a type spelled prefix + "n)" or prefix + "n,...)".
func typmod(pgType, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(pgType, prefix)
	if !ok || !strings.HasSuffix(rest, ")") {
		return 0, false
	}
	rest, _, _ = strings.Cut(strings.TrimSuffix(rest, ")"), ",")
	n, err := strconv.Atoi(strings.TrimSpace(rest))
	return n, err == nil
}

// roundRat rounds r to scale decimals, half away from zero, as numeric
// does.
func roundRat(r *big.Rat, scale int) {
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil)
	x := new(big.Rat).Mul(r, new(big.Rat).SetInt(pow))
	num, den := x.Num(), x.Denom()
	q, m := new(big.Int).QuoRem(new(big.Int).Abs(num), den, new(big.Int))
	if new(big.Int).Mul(m, big.NewInt(2)).Cmp(den) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	if num.Sign() < 0 {
		q.Neg(q)
	}
	r.SetFrac(q, pow)
}

// keyText appends a converted value to a key that collapses and orders
// rows: every kind renders distinctly, NULL included.
func keyText(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, 1, 0)
	case string:
		b = append(b, 2)
		b = append(b, x...)
	case int64:
		b = append(b, 2)
		b = strconv.AppendInt(b, x, 10)
	case float64:
		b = append(b, 2)
		b = strconv.AppendFloat(b, x, 'g', -1, 64)
	case time.Time:
		b = append(b, 2)
		b = strconv.AppendInt(b, x.UnixNano(), 10)
	case bool:
		b = append(b, 2)
		b = strconv.AppendBool(b, x)
	}
	return append(b, 0)
}

// column builds one column's array for the statement from rows' values.
func column(k wireKind, n int, at func(j int) any) any {
	switch k {
	case wireInt:
		return typedColumn(n, at, func(v []int64) any { return int8Array(v) })
	case wireFloat:
		return typedColumn(n, at, func(v []float64) any { return float8Array(v) })
	case wireTime:
		return typedColumn(n, at, func(v []time.Time) any { return timestamptzArray(v) })
	case wireBool:
		return typedColumn(n, at, func(v []bool) any { return v })
	}
	return typedColumn(n, at, func(v []string) any { return textArray(v) })
}

// typedColumn is a column of values of type T: flat(vals) when none is
// NULL, a []*T with nil for NULL otherwise. PostgreSQL receives the same
// array either way.
func typedColumn[T any](n int, at func(j int) any, flat func([]T) any) any {
	vals := make([]T, n)
	for j := range n {
		v, ok := at(j).(T)
		if !ok {
			out := make([]*T, n)
			for j := range n {
				if v, ok := at(j).(T); ok {
					out[j] = &v
				}
			}
			return out
		}
		vals[j] = v
	}
	return flat(vals)
}

// The arrays of a statement's columns without NULLs, as pgx encodes them
// (pgtype.ArrayGetter): each element is handed over as a pointer into the
// slice, of a type that implements its codec's valuer interface. A plain
// []string, []int64, []float64 or []time.Time goes through pgx's
// FlatArray, whose Index boxes every element: an allocation per value
// sent, about a fifth of an upsert pipeline's allocations. A pointer in an
// interface allocates nothing, and the bytes on the wire are the same.
// Where pgx knows no parameter types (exec modes exec, simple_protocol)
// they travel as text (Value).
type (
	textArray        []string
	int8Array        []int64
	float8Array      []float64
	timestamptzArray []time.Time

	textElem        string
	int8Elem        int64
	float8Elem      float64
	timestamptzElem time.Time
)

func arrayDims(n int) []pgtype.ArrayDimension {
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

// arrayText is an array's text form, for the query exec modes that send
// parameters of no known type (exec, simple_protocol: pgx finds no codec
// for the arrays above there, and asks driver.Valuer); the statement's
// cast reads it as the array. plain is the column as a plain slice.
func arrayText(oid uint32, plain any) (driver.Value, error) {
	b, err := pgtype.NewMap().Encode(oid, pgtype.TextFormatCode, plain, nil)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}

func (a textArray) Value() (driver.Value, error) { return arrayText(pgtype.TextArrayOID, []string(a)) }
func (a int8Array) Value() (driver.Value, error) { return arrayText(pgtype.Int8ArrayOID, []int64(a)) }
func (a float8Array) Value() (driver.Value, error) {
	return arrayText(pgtype.Float8ArrayOID, []float64(a))
}
func (a timestamptzArray) Value() (driver.Value, error) {
	return arrayText(pgtype.TimestamptzArrayOID, []time.Time(a))
}

func (a textArray) Dimensions() []pgtype.ArrayDimension        { return arrayDims(len(a)) }
func (a textArray) Index(i int) any                            { return (*textElem)(&a[i]) }
func (a textArray) IndexType() any                             { return new(textElem) }
func (a int8Array) Dimensions() []pgtype.ArrayDimension        { return arrayDims(len(a)) }
func (a int8Array) Index(i int) any                            { return (*int8Elem)(&a[i]) }
func (a int8Array) IndexType() any                             { return new(int8Elem) }
func (a float8Array) Dimensions() []pgtype.ArrayDimension      { return arrayDims(len(a)) }
func (a float8Array) Index(i int) any                          { return (*float8Elem)(&a[i]) }
func (a float8Array) IndexType() any                           { return new(float8Elem) }
func (a timestamptzArray) Dimensions() []pgtype.ArrayDimension { return arrayDims(len(a)) }
func (a timestamptzArray) Index(i int) any                     { return (*timestamptzElem)(&a[i]) }
func (a timestamptzArray) IndexType() any                      { return new(timestamptzElem) }

func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

func (e *int8Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*e), Valid: true}, nil
}

func (e *float8Elem) Float64Value() (pgtype.Float8, error) {
	return pgtype.Float8{Float64: float64(*e), Valid: true}, nil
}

func (e *timestamptzElem) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*e), Valid: true}, nil
}
