package event

import (
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// wire builds protobuf bytes by hand, for shapes proto.Marshal never
// writes (repeated fields, unknown fields, odd wire types).
type wire []byte

func (w wire) str(num protowire.Number, s string) wire {
	return protowire.AppendString(protowire.AppendTag(w, num, protowire.BytesType), s)
}

func (w wire) bytes(num protowire.Number, b []byte) wire {
	return protowire.AppendBytes(protowire.AppendTag(w, num, protowire.BytesType), b)
}

func (w wire) fixed64(num protowire.Number, v uint64) wire {
	return protowire.AppendFixed64(protowire.AppendTag(w, num, protowire.Fixed64Type), v)
}

func (w wire) varint(num protowire.Number, v uint64) wire {
	return protowire.AppendVarint(protowire.AppendTag(w, num, protowire.VarintType), v)
}

func ts(seconds int64, nanos uint64) []byte {
	return wire(nil).varint(fieldSeconds, uint64(seconds)).varint(fieldNanos, nanos)
}

func entry(k, v string) []byte { return wire(nil).str(fieldKey, k).str(fieldVal, v) }

// fastCases are values with what the fast path must do with them: take
// them (fast true) or leave them to proto.Unmarshal. Either way Decode's
// answer must equal proto.Unmarshal's.
var fastCases = []struct {
	name  string
	value []byte
	fast  bool
}{
	{"empty", nil, true},
	{"all fields", wire(nil).str(fieldID, "e1").str(fieldMetric, "m").fixed64(fieldValue, math.Float64bits(2.5)).
		bytes(fieldTime, ts(1767323045, 6)).bytes(fieldLabels, entry("a", "b")).bytes(fieldLabels, entry("c", "d")), true},
	{"fields out of order", wire(nil).bytes(fieldLabels, entry("a", "b")).bytes(fieldTime, ts(5, 0)).str(fieldMetric, "m"), true},
	{"last scalar wins", wire(nil).str(fieldMetric, "first").str(fieldMetric, "second").
		fixed64(fieldValue, math.Float64bits(1)).fixed64(fieldValue, math.Float64bits(2)).bytes(fieldTime, ts(1, 0)), true},
	{"time fields merge", wire(nil).str(fieldMetric, "m").bytes(fieldTime, wire(nil).varint(fieldSeconds, 7)).
		bytes(fieldTime, wire(nil).varint(fieldNanos, 9)), true},
	{"negative seconds", wire(nil).str(fieldMetric, "m").bytes(fieldTime, ts(-62135596800, 0)), true},
	{"nanos truncated to int32", wire(nil).str(fieldMetric, "m").bytes(fieldTime, ts(1, 1<<33|5)), true},
	{"last label wins", wire(nil).str(fieldMetric, "m").bytes(fieldTime, ts(1, 0)).
		bytes(fieldLabels, entry("k", "1")).bytes(fieldLabels, entry("k", "2")), true},
	{"label without key or value", wire(nil).str(fieldMetric, "m").bytes(fieldTime, ts(1, 0)).
		bytes(fieldLabels, wire(nil).str(fieldVal, "v")).bytes(fieldLabels, nil), true},
	{"empty time", wire(nil).str(fieldMetric, "m").bytes(fieldTime, nil), true},
	{"unknown field", wire(nil).str(fieldMetric, "m").bytes(fieldTime, ts(1, 0)).varint(9, 1), false},
	{"unknown field in time", wire(nil).str(fieldMetric, "m").bytes(fieldTime, wire(ts(1, 0)).varint(3, 1)), false},
	{"unknown field in label", wire(nil).str(fieldMetric, "m").bytes(fieldTime, ts(1, 0)).
		bytes(fieldLabels, wire(entry("k", "v")).varint(3, 1)), false},
	{"metric as varint", wire(nil).varint(fieldMetric, 1).bytes(fieldTime, ts(1, 0)), false},
	{"value as varint", wire(nil).str(fieldMetric, "m").varint(fieldValue, 1).bytes(fieldTime, ts(1, 0)), false},
	{"metric not UTF-8", wire(nil).str(fieldMetric, "\xff").bytes(fieldTime, ts(1, 0)), false},
	{"label not UTF-8", wire(nil).str(fieldMetric, "m").bytes(fieldTime, ts(1, 0)).bytes(fieldLabels, entry("k", "\xfe")), false},
	{"length past the end", []byte{byte(fieldMetric<<3 | protowire.BytesType), 10, 'm'}, false},
	{"truncated fixed64", []byte{byte(fieldValue<<3 | protowire.Fixed64Type), 1, 2}, false},
	{"field number zero", []byte{0, 1}, false},
	{"garbage", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, false},
	{"json", []byte(`{"metric":"m","time":"2026-01-02T03:04:05Z"}`), false},
}

func TestFastPathMatchesProtoUnmarshal(t *testing.T) {
	for _, tc := range fastCases {
		t.Run(tc.name, func(t *testing.T) {
			err := unmarshalFast(tc.value, new(ratchetv1.Event), &interner{}, nil)
			if fast := err == nil; fast != tc.fast {
				t.Fatalf("fast path taken = %v, want %v (err %v)", fast, tc.fast, err)
			}
			checkSameAsProto(t, tc.value)
		})
	}
}

// TestGeneratedEventsTakeTheFastPath keeps the fast path from going quiet:
// what proto.Marshal writes for a full event is what it is for.
func TestGeneratedEventsTakeTheFastPath(t *testing.T) {
	for _, ev := range seedEvents() {
		value := mustEncode(t, FormatProtobuf, ev)
		if err := unmarshalFast(value, new(ratchetv1.Event), nil, nil); err != nil {
			t.Errorf("%v: %v", ev, err)
		}
	}
}

// TestDecoderSharesRepeatedStrings: a Decoder allocates a metric name once,
// and events decoded by it stay independent of each other.
func TestDecoderSharesRepeatedStrings(t *testing.T) {
	d := NewDecoder(FormatProtobuf)
	value := mustEncode(t, FormatProtobuf, sample())
	first, err := d.Decode(value)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := d.Decode(value); err != nil {
			t.Fatal(err)
		}
	})
	plain := testing.AllocsPerRun(100, func() {
		if _, err := Decode(FormatProtobuf, value); err != nil {
			t.Fatal(err)
		}
	})
	// The sample repeats metric, two label keys and two label values.
	if allocs > plain-5 {
		t.Errorf("Decoder: %.0f allocations per event, Decode: %.0f; want at least 5 fewer", allocs, plain)
	}
	second, err := d.Decode(value)
	if err != nil {
		t.Fatal(err)
	}
	second.Labels["country"] = "changed"
	if first.Labels["country"] != "nl" {
		t.Errorf("changing one event's labels changed another's: %q", first.Labels["country"])
	}
}

// TestInternerIsBounded: distinct strings past the bound are still
// returned, just not kept.
func TestInternerIsBounded(t *testing.T) {
	var in interner
	for i := range maxInterned + 100 {
		b := protowire.AppendVarint(nil, uint64(i))
		if got := in.str(b); got != string(b) {
			t.Fatalf("str(%q) = %q", b, got)
		}
	}
	if len(in.m) != maxInterned {
		t.Errorf("interner holds %d strings, bound %d", len(in.m), maxInterned)
	}
	long := make([]byte, maxInternedLen+1)
	in.m = nil
	in.str(long)
	if len(in.m) != 0 {
		t.Errorf("a %d-byte string was kept", len(long))
	}
}

// FuzzFastPathMatchesProtoUnmarshal: whatever the fast path accepts, it
// decodes exactly as proto.Unmarshal does, and Decode (fast path or not)
// answers as proto.Unmarshal plus Validate would.
func FuzzFastPathMatchesProtoUnmarshal(f *testing.F) {
	for _, tc := range fastCases {
		f.Add(tc.value)
	}
	for _, ev := range seedEvents() {
		f.Add(mustEncode(f, FormatProtobuf, ev))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		checkSameAsProto(t, value)
	})
}

// checkSameAsProto compares the fast path and Decode with proto.Unmarshal
// on value.
func checkSameAsProto(t *testing.T, value []byte) {
	t.Helper()
	want := new(ratchetv1.Event)
	protoErr := proto.Unmarshal(value, want)

	fast := new(ratchetv1.Event)
	if err := unmarshalFast(value, fast, &interner{}, nil); err == nil {
		if protoErr != nil {
			t.Fatalf("fast path accepted %x; proto.Unmarshal: %v", value, protoErr)
		}
		if !proto.Equal(fast, want) {
			t.Fatalf("fast path decoded %x as %v; proto.Unmarshal: %v", value, fast, want)
		}
	}

	for _, decode := range []func([]byte) (*ratchetv1.Event, error){
		func(v []byte) (*ratchetv1.Event, error) { return Decode(FormatProtobuf, v) },
		NewDecoder(FormatProtobuf).Decode,
	} {
		got, err := decode(value)
		switch {
		case protoErr != nil:
			if err == nil || !IsPoison(err) {
				t.Fatalf("Decode(%x) = %v, %v; proto.Unmarshal failed: %v", value, got, err, protoErr)
			}
		case Validate(want) != nil:
			if err == nil || err.Error() != Validate(want).Error() {
				t.Fatalf("Decode(%x) error %v; want %v", value, err, Validate(want))
			}
		case err != nil:
			t.Fatalf("Decode(%x): %v; proto.Unmarshal decoded %v", value, err, want)
		case !proto.Equal(got, want):
			t.Fatalf("Decode(%x) = %v; proto.Unmarshal: %v", value, got, want)
		}
	}
}
