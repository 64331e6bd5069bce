package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/common/types"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// TestFastPathAgreesWithTheInterpreter: a field path of value evaluated
// without the interpreter gives what the interpreter gives, or declines.
func TestFastPathAgreesWithTheInterpreter(t *testing.T) {
	env, err := newEnv(true)
	if err != nil {
		t.Fatal(err)
	}
	c := &compiler{env: env}
	json, err := DecodeJSON([]byte(`{"a":{"b":"x","n":12,"f":1.5,"t":true,"z":null,"l":[1],"m":{"k":1}},"big":18446744073709551615}`), false)
	if err != nil {
		t.Fatal(err)
	}
	ev := &ratchetv1.Event{Id: "e1", Metric: "m", Value: 2.5, Time: timestamppb.New(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))}
	values := map[string]any{"json": json, "event": ev, "event without time": &ratchetv1.Event{Metric: "m"}}
	paths := []string{"value.a.b", "value.a.n", "value.a.f", "value.a.t", "value.a.z", "value.a.l", "value.a.m", "value.a.missing",
		"value.big", "value.metric", "value.value", "value.id", "value.time", "value.labels", "value.a.b.c"}
	adapter := env.CELTypeAdapter()
	fast := 0
	for name, v := range values {
		for _, src := range paths {
			e := c.compile("k", src, "")
			if e == nil || e.path == nil {
				t.Fatalf("%s: not compiled as a field path", src)
			}
			rec := &processor.Record{Value: []byte{1}}
			act := &recordActivation{rec: rec, adapter: adapter, value: v}
			got, ok := e.fast(act)
			want, _, werr := e.prg.Eval(&recordActivation{rec: rec, adapter: adapter, value: v})
			if !ok {
				continue
			}
			fast++
			if werr != nil {
				t.Errorf("%s on %s: fast %v, the interpreter fails: %v", src, name, got, werr)
				continue
			}
			if got.Equal(want) != types.True || got.Type() != want.Type() {
				t.Errorf("%s on %s: fast %v (%s), the interpreter %v (%s)", src, name, got, got.Type(), want, want.Type())
			}
		}
	}
	if fast < 10 {
		t.Errorf("the fast path answered only %d times", fast)
	}
}

// TestFormsAgreeWithTheInterpreter: every form (a field path, a field of
// record, a conversion, a comparison with a literal) evaluated without
// the interpreter gives what the interpreter gives, or declines; and an
// expression evaluated with its form gives the same value or the same
// error text as without it, on values of every type, absent keys, nulls,
// strings a conversion refuses, keys that are not UTF-8 and tombstones.
func TestFormsAgreeWithTheInterpreter(t *testing.T) {
	env, err := newEnv(true)
	if err != nil {
		t.Fatal(err)
	}
	docs := []string{
		`{"s":"x","n":12,"f":1.5,"g":-0.0,"t":true,"z":null,"l":[1],"m":{"k":1,"s":"7"},"num":"12.5","int":"42","ts":"2026-12-01T09:00:00Z","big":18446744073709551615,"neg":-3,"huge":1e300,"status":"test"}`,
		`{"s":"","n":0,"f":1e20,"t":false,"z":{},"l":[],"m":null,"num":"a lot","int":"4.2","ts":"yesterday","big":-9223372036854775808,"neg":-3.5,"huge":-1e19,"status":"new"}`,
		`{"s":12,"n":"12","f":true,"t":"true","num":1,"int":1.0,"ts":1733043600,"status":null}`,
		`{}`,
	}
	var values []any
	for _, d := range docs {
		v, err := DecodeJSON([]byte(d), false)
		if err != nil {
			t.Fatal(err)
		}
		values = append(values, v)
	}
	values = append(values, &ratchetv1.Event{Id: "e1", Metric: "m", Value: 2.5, Time: timestamppb.New(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))},
		&ratchetv1.Event{Metric: "m"}, nil)
	recs := []*processor.Record{
		{Topic: "orders", Partition: 3, Offset: 17, Key: []byte("o1"), Value: []byte{1}, Timestamp: time.Date(2026, 12, 1, 9, 0, 0, 123456789, time.UTC)},
		{Topic: "t", Partition: 0, Offset: 0, Key: nil, Value: []byte{1}},
		{Topic: "t", Partition: 1, Offset: 1 << 40, Key: []byte{0xff, 0xfe}, Value: []byte{1}, Timestamp: time.Unix(0, 0)},
		{Topic: "t", Key: []byte("k")}, // a tombstone
		{Topic: "t", Key: []byte(strings.Repeat("k", 100)), Value: []byte{1}},
	}
	var srcs []string
	for _, p := range []string{"value.s", "value.n", "value.f", "value.g", "value.t", "value.z", "value.l", "value.m", "value.m.k", "value.m.s",
		"value.num", "value.int", "value.ts", "value.big", "value.neg", "value.huge", "value.missing", "value.m.missing",
		"value.metric", "value.value", "value.time", "value.id", "value.labels",
		"record.key", "record.timestamp", "record.topic", "record.partition", "record.offset"} {
		srcs = append(srcs, p, "double("+p+")", "int("+p+")", "string("+p+")")
		for _, lit := range []string{`"test"`, `"x"`, `12`, `12.0`, `1.5`, `12u`, `true`, `null`, `""`} {
			srcs = append(srcs, p+" == "+lit, p+" != "+lit, lit+" != "+p)
		}
	}
	srcs = append(srcs, `double(value.m.s) == 7.0`, `value.s + "x" == "xx"`, `has(value.s)`, `record.headers`)
	adapter := env.CELTypeAdapter()
	for _, limit := range []uint64{0, 2_000, 500} {
		c := &compiler{env: env, costLimit: limit}
		forms, fast := 0, 0
		for _, src := range srcs {
			e := c.compile("k", src, "")
			if e == nil {
				t.Fatalf("%s: does not compile: %v", src, c.ps)
			}
			if e.form == nil {
				continue
			}
			forms++
			plain := *e
			plain.form = nil
			for _, v := range values {
				for _, rec := range recs {
					value := v
					if rec.Value == nil {
						value = nil
					}
					act := func() *recordActivation { return &recordActivation{rec: rec, adapter: adapter, value: value} }
					name := fmt.Sprintf("%s on %v, record %s@%d", src, value, rec.Key, rec.Offset)
					if got, ok := e.fast(act()); ok {
						fast++
						want, _, werr := e.prg.Eval(act())
						if werr != nil {
							t.Errorf("%s: fast %v, the interpreter fails: %v", name, got, werr)
						} else if got.Equal(want) != types.True || got.Type() != want.Type() {
							t.Errorf("%s: fast %v (%s), the interpreter %v (%s)", name, got, got.Type(), want, want.Type())
						}
					}
					got, gerr := e.eval(act())
					want, werr := plain.eval(act())
					switch {
					case (gerr == nil) != (werr == nil):
						t.Errorf("%s: with the form %v, %v; without %v, %v", name, got, gerr, want, werr)
					case gerr != nil && gerr.Error() != werr.Error():
						t.Errorf("%s: with the form %q; without %q", name, gerr, werr)
					case gerr == nil && (got.Equal(want) != types.True || got.Type() != want.Type()):
						t.Errorf("%s: with the form %v (%s); without %v (%s)", name, got, got.Type(), want, want.Type())
					}
				}
			}
		}
		t.Logf("cost limit %d: %d of %d expressions have a form, answered %d times", limit, forms, len(srcs), fast)
		if forms < len(srcs)/3 || fast < 1000 {
			t.Errorf("cost limit %d: %d of %d expressions have a form, answered %d times", limit, forms, len(srcs), fast)
		}
	}
}

// TestNativeColumnValuesAgree: a field path's value taken straight from
// the decoded document for a column is the value the column takes of the
// path's CEL value, for every kind of column, or is declined.
func TestNativeColumnValuesAgree(t *testing.T) {
	env, err := newEnv(true)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := DecodeJSON([]byte(`{"s":"x","e":"","sp":"ab   ","n":12,"big":18446744073709551615,"f":1.5,"z":-0.0,"t":true,"nul":null,"l":[1],"m":{"k":"v","n":3}}`), false)
	if err != nil {
		t.Fatal(err)
	}
	c := &compiler{env: env}
	adapter := env.CELTypeAdapter()
	rec := &processor.Record{Value: []byte{1}}
	native := 0
	for _, src := range []string{"value.s", "value.e", "value.sp", "value.n", "value.big", "value.f", "value.z", "value.t", "value.nul",
		"value.l", "value.m", "value.m.k", "value.m.n", "value.missing", "value.s.x"} {
		e := c.compile("k", src, "")
		if e == nil {
			t.Fatalf("%s: does not compile: %v", src, c.ps)
		}
		for _, typ := range []string{"text", "character varying", "character varying(2)", "bigint", "integer", "double precision", "real",
			"boolean", "numeric", "jsonb", "timestamp with time zone", "timestamp without time zone", "uuid"} {
			k := wireOf(typ)
			act := &recordActivation{rec: rec, adapter: adapter, value: doc}
			got, ok := e.native(act, k)
			if !ok {
				continue
			}
			native++
			v, err := e.eval(act)
			if err != nil {
				t.Errorf("%s for %s: native %v, CEL fails: %v", src, typ, got, err)
				continue
			}
			want, err := k.value(v, typ, e.bounds(act))
			if err != nil || got != want {
				t.Errorf("%s for %s: native %#v, the column takes %#v (%v)", src, typ, got, want, err)
			}
			if string(keyOf(nil, got, k, typ)) != string(keyOf(nil, want, k, typ)) {
				t.Errorf("%s for %s: keys differ", src, typ)
			}
		}
	}
	if native < 10 {
		t.Errorf("native values taken only %d times", native)
	}
}
