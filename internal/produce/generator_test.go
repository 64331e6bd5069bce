package produce

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"ratchet/internal/event"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

var fixedNow = time.Date(2026, 3, 14, 15, 9, 26, 535_000_000, time.UTC)

func fixedClock() time.Time { return fixedNow }

// decode decodes value in format, as the engine's decoder would.
func decode(format string, value []byte) (*ratchetv1.Event, error) {
	ev := &ratchetv1.Event{}
	var err error
	if format == event.FormatJSON {
		err = protojson.Unmarshal(value, ev)
	} else {
		err = proto.Unmarshal(value, ev)
	}
	return ev, err
}

// validEvent reports whether ev has what the schema requires.
func validEvent(ev *ratchetv1.Event) bool {
	return ev.GetMetric() != "" && len(ev.GetMetric()) <= 200 && ev.GetTime() != nil &&
		!math.IsNaN(ev.GetValue()) && !math.IsInf(ev.GetValue(), 0)
}

func TestGeneratorDeterministic(t *testing.T) {
	for _, format := range []string{event.FormatProtobuf, event.FormatJSON} {
		t.Run(format, func(t *testing.T) {
			opts := Options{Seed: 7, PoisonFraction: 0.2, Format: format, TimeSpread: time.Hour, Now: fixedClock}
			a, b := NewGenerator(opts), NewGenerator(opts)
			for i := range 500 {
				ka, va, ea, pa := a.Next()
				kb, vb, eb, pb := b.Next()
				if string(ka) != string(kb) || pa != pb || a.LastPoisonKind() != b.LastPoisonKind() {
					t.Fatalf("record %d differs: %s/%v/%s vs %s/%v/%s", i, ka, pa, a.LastPoisonKind(), kb, pb, b.LastPoisonKind())
				}
				if !proto.Equal(ea, eb) {
					t.Fatalf("record %d: events differ: %v vs %v", i, ea, eb)
				}
				// protojson output is only stable within one binary, so
				// compare bytes for protobuf and meaning for JSON.
				if format == event.FormatProtobuf && string(va) != string(vb) {
					t.Fatalf("record %d: values differ", i)
				}
			}
			other := NewGenerator(Options{Seed: 8, PoisonFraction: 0.2, Format: format, TimeSpread: time.Hour, Now: fixedClock})
			a = NewGenerator(opts)
			same := 0
			for range 100 {
				_, _, ea, _ := a.Next()
				_, _, eo, _ := other.Next()
				if ea != nil && eo != nil && ea.Metric == eo.Metric && ea.Value == eo.Value && ea.Time.AsTime().Equal(eo.Time.AsTime()) {
					same++
				}
			}
			if same > 20 {
				t.Errorf("seeds 7 and 8 gave %d of 100 equal events", same)
			}
		})
	}
}

func TestGeneratorRecords(t *testing.T) {
	const n = 3000
	for _, format := range []string{event.FormatProtobuf, event.FormatJSON} {
		t.Run(format, func(t *testing.T) {
			spread := 10 * time.Minute
			g := NewGenerator(Options{Seed: 1, PoisonFraction: 0.1, Format: format, TimeSpread: spread, Now: fixedClock})
			ids := make(map[string]bool)
			kinds := make(map[PoisonKind]int)
			var order []PoisonKind
			var integers, fractions, negatives int
			metrics := make(map[string]bool)
			for range n {
				key, value, ev, poison := g.Next()
				if ids[string(key)] {
					t.Fatalf("duplicate key %s", key)
				}
				ids[string(key)] = true
				if poison {
					kind := g.LastPoisonKind()
					kinds[kind]++
					order = append(order, kind)
					if ev != nil {
						t.Errorf("poison %s returned an event", kind)
					}
					checkPoison(t, format, kind, value)
					continue
				}
				if g.LastPoisonKind() != "" {
					t.Errorf("good record has poison kind %q", g.LastPoisonKind())
				}
				got, err := decode(format, value)
				if err != nil {
					t.Fatalf("good record %s does not decode: %v", key, err)
				}
				if !proto.Equal(got, ev) {
					t.Fatalf("decoded %v, Next returned %v", got, ev)
				}
				if !validEvent(got) || got.Id != string(key) || got.Labels["region"] == "" {
					t.Fatalf("good record %s is incomplete: %v", key, got)
				}
				ts := got.Time.AsTime()
				if ts.After(fixedNow) || ts.Before(fixedNow.Add(-spread-time.Millisecond)) {
					t.Errorf("event time %s outside [now-%s, now]", ts, spread)
				}
				if v := got.Value * 4; v != math.Trunc(v) {
					t.Errorf("value %v is not a multiple of 0.25", got.Value)
				}
				switch {
				case got.Value < 0:
					negatives++
				case got.Value == math.Trunc(got.Value):
					integers++
				default:
					fractions++
				}
				metrics[got.Metric] = true
			}
			poison := kinds[PoisonGarbage] + kinds[PoisonWrongFormat] + kinds[PoisonMissingField]
			if poison < n*5/100 || poison > n*15/100 {
				t.Errorf("%d poison records of %d at fraction 0.1", poison, n)
			}
			for i, k := range order {
				if want := poisonKinds[i%3]; k != want {
					t.Fatalf("poison %d is %s, want %s (kinds cycle)", i, k, want)
				}
			}
			if integers == 0 || fractions == 0 || negatives == 0 {
				t.Errorf("values: %d integers, %d fractions, %d negatives; want some of each", integers, fractions, negatives)
			}
			if len(metrics) != len(DefaultMetrics) {
				t.Errorf("saw metrics %v, want all of %v", metrics, DefaultMetrics)
			}
		})
	}
}

// checkPoison asserts that value, of the given kind, is refused by a decoder
// expecting format.
func checkPoison(tb testing.TB, format string, kind PoisonKind, value []byte) {
	tb.Helper()
	ev, err := decode(format, value)
	switch kind {
	case PoisonGarbage:
		if err == nil {
			tb.Fatalf("garbage %x decodes as %s", value, format)
		}
		if err := proto.Unmarshal(value, &ratchetv1.Event{}); err == nil {
			tb.Fatalf("garbage %x passes proto.Unmarshal", value)
		}
		if err := protojson.Unmarshal(value, &ratchetv1.Event{}); err == nil {
			tb.Fatalf("garbage %x passes protojson.Unmarshal", value)
		}
	case PoisonWrongFormat:
		if err == nil && validEvent(ev) {
			tb.Fatalf("wrong-format record %q decodes as a valid %s event %v", value, format, ev)
		}
		other := event.FormatJSON
		if format == event.FormatJSON {
			other = event.FormatProtobuf
		}
		if ev, err := decode(other, value); err != nil || !validEvent(ev) {
			tb.Fatalf("wrong-format record is not a valid %s event: %v", other, err)
		}
	case PoisonMissingField:
		if err != nil {
			tb.Fatalf("missing-field record does not decode as %s: %v", format, err)
		}
		if validEvent(ev) {
			tb.Fatalf("missing-field record is a valid event: %v", ev)
		}
	default:
		tb.Fatalf("unknown poison kind %q", kind)
	}
}

func TestGeneratorNoPoison(t *testing.T) {
	g := NewGenerator(Options{Seed: 3, Metrics: []string{"temperature"}})
	for range 200 {
		_, _, ev, poison := g.Next()
		if poison || ev == nil || ev.Metric != "temperature" {
			t.Fatalf("got poison=%v ev=%v, want a temperature event", poison, ev)
		}
	}
}

func TestGeneratorAllPoison(t *testing.T) {
	g := NewGenerator(Options{Seed: 3, PoisonFraction: 1})
	var missingMetric, missingTime int
	for range 60 {
		_, value, _, poison := g.Next()
		if !poison {
			t.Fatal("good record at poison fraction 1")
		}
		if g.LastPoisonKind() == PoisonMissingField {
			ev, err := decode(event.FormatProtobuf, value)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Metric == "" {
				missingMetric++
			}
			if ev.Time == nil {
				missingTime++
			}
		}
	}
	if missingMetric != 10 || missingTime != 10 {
		t.Errorf("missing-field records: %d without metric, %d without time; want 10 and 10", missingMetric, missingTime)
	}
}
