package event

import (
	"errors"
	"math"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// maxErrorBytes bounds Error() of anything Decode returns: the text goes
// into a Kafka header.
const maxErrorBytes = 256

// seedEvents are encoded in both formats as fuzz seeds; some are invalid on
// purpose. More seeds, including hand-written bytes, are in testdata/fuzz.
func seedEvents() []*ratchetv1.Event {
	return []*ratchetv1.Event{
		sample(),
		{Metric: "m", Time: timestamppb.New(eventTime)},
		{Metric: "m"},
		{Time: timestamppb.New(eventTime)},
		{Metric: "m", Value: math.NaN(), Time: timestamppb.New(eventTime)},
		{Metric: "m", Time: &timestamppb.Timestamp{Seconds: -1, Nanos: 999_999_999}},
	}
}

// FuzzDecodeProtobuf feeds arbitrary record values to Decode(FormatProtobuf).
func FuzzDecodeProtobuf(f *testing.F) {
	for _, ev := range seedEvents() {
		f.Add(mustEncode(f, FormatProtobuf, ev))
		f.Add(mustEncode(f, FormatJSON, ev))
	}
	f.Add([]byte{})
	f.Add([]byte("\xff\xff\xff\xff"))
	f.Add([]byte("\t{\"a\": 1}"))
	f.Fuzz(func(t *testing.T, value []byte) {
		checkClassified(t, FormatProtobuf, value)
	})
}

// FuzzDecodeJSON feeds arbitrary record values to Decode(FormatJSON).
func FuzzDecodeJSON(f *testing.F) {
	for _, ev := range seedEvents() {
		f.Add(mustEncode(f, FormatJSON, ev))
		f.Add(mustEncode(f, FormatProtobuf, ev))
	}
	f.Add([]byte(`{"metric":"m","value":"Infinity","time":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"metric":"m","time":"2026-01-02T03:04:05Z","labels":{"a":"b"},"extra":1}`))
	f.Add([]byte(`{"metric":`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, value []byte) {
		checkClassified(t, FormatJSON, value)
	})
}

// checkClassified is the fuzz property: Decode does not panic, and either
// returns a valid event that survives a re-encode in the same format, or a
// short, printable *Error and no event.
func checkClassified(t *testing.T, format string, value []byte) {
	t.Helper()
	ev, err := Decode(format, value)
	// A Decoder (events from a slab, shared strings) decides the same.
	d := NewDecoder(format)
	for range 2 {
		dev, derr := d.Decode(value)
		if (err == nil) != (derr == nil) || (err == nil && !proto.Equal(ev, dev)) {
			t.Fatalf("Decode: %v, %v; Decoder.Decode: %v, %v", ev, err, dev, derr)
		}
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %T %q is not *Error", err, err)
		}
		if e.Kind != KindDecode && e.Kind != KindInvalid {
			t.Fatalf("error kind %q", e.Kind)
		}
		if !IsPoison(err) {
			t.Fatalf("IsPoison(%q) = false", err)
		}
		if ev != nil {
			t.Fatalf("event %v returned with error %q", ev, err)
		}
		msg := err.Error()
		if len(msg) > maxErrorBytes || !utf8.ValidString(msg) {
			t.Fatalf("error text is %d bytes or not UTF-8: %q", len(msg), msg)
		}
		return
	}
	if err := Validate(ev); err != nil {
		t.Fatalf("Decode returned an event Validate refuses: %v", err)
	}
	b, err := Encode(format, ev)
	if err != nil {
		t.Fatalf("re-encode %v: %v", ev, err)
	}
	again, err := Decode(format, b)
	if err != nil {
		t.Fatalf("decode re-encoded %q: %v", b, err)
	}
	if !proto.Equal(ev, again) {
		t.Fatalf("re-encode changed the event: %v != %v", ev, again)
	}
}
