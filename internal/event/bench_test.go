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
