package event

import (
	"testing"

	"google.golang.org/protobuf/proto"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

func BenchmarkDecodeProtobuf(b *testing.B) {
	benchmarkDecode(b, FormatProtobuf)
}

func BenchmarkDecodeJSON(b *testing.B) {
	benchmarkDecode(b, FormatJSON)
}

// BenchmarkDecoderProtobuf is what a partition actor runs: the fast path
// with repeated strings shared.
func BenchmarkDecoderProtobuf(b *testing.B) {
	value := mustEncode(b, FormatProtobuf, sample())
	d := NewDecoder(FormatProtobuf)
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(value); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeProtobufReflect is the baseline the fast path is measured
// against: proto.Unmarshal and Validate, as Decode did before it.
func BenchmarkDecodeProtobufReflect(b *testing.B) {
	value := mustEncode(b, FormatProtobuf, sample())
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	for b.Loop() {
		ev := new(ratchetv1.Event)
		if err := proto.Unmarshal(value, ev); err != nil {
			b.Fatal(err)
		}
		if err := Validate(ev); err != nil {
			b.Fatal(err)
		}
	}
}

func benchmarkDecode(b *testing.B, format string) {
	value := mustEncode(b, format, sample())
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(format, value); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecoderAllocations holds a Decoder to its allocations an event: the
// id string and the labels map (two: its header and its slots), with the
// event and its time taken from a slab (five before the slabs). Decoding
// is about a quarter of the engine's CPU in a backlog drain (make bench).
func TestDecoderAllocations(t *testing.T) {
	value := mustEncode(t, FormatProtobuf, sample())
	d := NewDecoder(FormatProtobuf)
	got := testing.AllocsPerRun(slabSize*10, func() {
		if _, err := d.Decode(value); err != nil {
			t.Fatal(err)
		}
	})
	if got > 3.1 {
		t.Fatalf("%.2f allocations an event, want at most 3 (id, labels map) and a share of a slab", got)
	}
	// Every event is its own: decoding the next one leaves the last intact.
	a, _ := d.Decode(value)
	b, _ := d.Decode(value)
	if a == b || a.Time == b.Time || !proto.Equal(a, b) {
		t.Fatalf("two decodes share state: %p %p, times %p %p", a, b, a.Time, b.Time)
	}
}
