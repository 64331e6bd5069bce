package event

import "testing"

func BenchmarkDecodeProtobuf(b *testing.B) {
	benchmarkDecode(b, FormatProtobuf)
}

func BenchmarkDecodeJSON(b *testing.B) {
	benchmarkDecode(b, FormatJSON)
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
