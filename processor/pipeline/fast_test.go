package pipeline

import (
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
