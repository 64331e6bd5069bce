package pipeline

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

// toTime at the edges: PostgreSQL's range (where pgx's microseconds from
// 2000 would overflow), doubles whose microseconds overflow an int64, and
// the window's bounds, inclusive.
func TestToTimeEdges(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	b := timeBounds{ref: at, past: 24 * time.Hour, future: time.Hour, key: "epoch_millis_window"}
	wide := timeBounds{key: "epoch_millis_window"}          // no reference: the range only
	last := time.Unix(math.MaxInt64/1_000_000-1, 999999000) // pgx's last, 294247-01-10
	cases := []struct {
		name string
		v    ref.Val
		b    timeBounds
		want time.Time
		err  string
	}{
		{"a day before", types.Int(at.Add(-24 * time.Hour).UnixMilli()), b, at.Add(-24 * time.Hour), ""},
		{"a day and a millisecond before", types.Int(at.Add(-24*time.Hour).UnixMilli() - 1), b, time.Time{}, "more than 1d before"},
		{"an hour after", types.Double(float64(at.Add(time.Hour).UnixMilli())), b, at.Add(time.Hour), ""},
		{"an hour and a millisecond after", types.String(`1796119200001`), b, time.Time{}, "more than 1h0m0s after"},
		{"fraction to the microsecond", types.Double(1796115600000.25), b, at.Add(250 * time.Microsecond), ""},
		{"negative fraction", types.Double(-0.5), wide, time.Unix(0, -500000), ""},
		{"the last microsecond pgx encodes", types.Int(last.UnixMilli()), wide, last.Truncate(time.Millisecond), ""},
		{"a millisecond later", types.Int(last.UnixMilli() + 1), wide, time.Time{}, "beyond what a timestamptz holds"},
		{"a double past an int64 of microseconds", types.Double(1e16), wide, time.Time{}, "beyond what a timestamptz holds"},
		{"before 4714-11-24 BC", types.Int(-211813488000000 + 946684800000 - 1), wide, time.Time{}, "beyond what a timestamptz holds"},
		{"4714-11-24 BC", types.Int(-211813488000000 + 946684800000), wide, time.Unix(-211813488000+946684800, 0), ""},
		{"the largest uint", types.Uint(^uint64(0)), wide, time.Time{}, "epoch nanoseconds?"},
		{"NaN", types.Double(math.NaN()), wide, time.Time{}, "beyond what a timestamptz holds"},
		{"null", types.NullValue, b, time.Time{}, "no time (null)"},
		{"a bare year", types.String("2026"), b, time.Time{}, "more than 1d before"},
		{"not a number", types.String("1e"), b, time.Time{}, "no number of epoch milliseconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := toTime(tc.v, tc.b)
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("toTime = %v, %v; want an error with %q", got, err, tc.err)
			case tc.err == "" && err != nil:
				t.Fatalf("toTime: %v", err)
			case tc.err == "" && !got.Equal(tc.want):
				t.Fatalf("toTime = %v, want %v", got, tc.want)
			}
		})
	}
}

// Expressions whose cost cannot pass the limit whatever the record skip
// the cost tracking and the context; those that grow with the record keep
// them.
func TestBoundedExpressions(t *testing.T) {
	env, err := newEnv(true)
	if err != nil {
		t.Fatal(err)
	}
	c := &compiler{env: env}
	for src, want := range map[string]bool{
		"value.a.b":                        true,
		"double(value.amount) * 2.0 + 1.0": true,
		"record.offset > 10":               true,
		"value.items.exists(x, x == 1)":    false,
		`value.s.contains("x")`:            false,
		"value.items.map(x, value.items.map(y, x + y)).size() > 0": false,
	} {
		e := c.compile("k", src, "")
		if e == nil {
			t.Fatalf("%s does not compile: %v", src, c.ps)
		}
		if e.bounded != want {
			t.Errorf("%s: bounded %v, want %v", src, e.bounded, want)
		}
	}
}
