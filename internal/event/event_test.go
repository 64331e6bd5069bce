package event

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

var eventTime = time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)

// sample returns a fully populated, valid event.
func sample() *ratchetv1.Event {
	return &ratchetv1.Event{
		Id:     "evt-1",
		Metric: "page_view",
		Value:  1.5,
		Time:   timestamppb.New(eventTime),
		Labels: map[string]string{"country": "nl", "device": "mobile"},
	}
}

// with returns sample modified by fn.
func with(fn func(ev *ratchetv1.Event)) *ratchetv1.Event {
	ev := sample()
	fn(ev)
	return ev
}

func mustEncode(tb testing.TB, format string, ev *ratchetv1.Event) []byte {
	tb.Helper()
	b, err := Encode(format, ev)
	if err != nil {
		tb.Fatalf("encode %s: %v", format, err)
	}
	return b
}

func TestDecode(t *testing.T) {
	valid := sample()
	minimal := &ratchetv1.Event{Metric: "m", Time: timestamppb.New(eventTime)}
	pb := func(ev *ratchetv1.Event) []byte { return mustEncode(t, FormatProtobuf, ev) }
	js := func(ev *ratchetv1.Event) []byte { return mustEncode(t, FormatJSON, ev) }
	validPB := pb(valid)
	// A string field holding invalid UTF-8 cannot be produced by Encode.
	badUTF8 := protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xff")
	withUnknown := protowire.AppendString(protowire.AppendTag(pb(valid), 99, protowire.BytesType), "future")

	tests := []struct {
		name    string
		format  string
		value   []byte
		want    *ratchetv1.Event // on success
		kind    Kind             // on failure
		wantErr string           // exact Error() on failure, unless prefix is set
		prefix  bool
		unknown bool // the event keeps unknown fields
	}{
		{name: "protobuf/valid", format: FormatProtobuf, value: validPB, want: valid},
		{name: "protobuf/minimal", format: FormatProtobuf, value: pb(minimal), want: minimal},
		{name: "protobuf/empty format means protobuf", format: "", value: validPB, want: valid},
		{name: "protobuf/unknown field is kept", format: FormatProtobuf, value: withUnknown, want: valid, unknown: true},
		{name: "protobuf/not protobuf", format: FormatProtobuf, value: []byte("\xff\xff\xff\xff"),
			kind: KindDecode, wantErr: "decode protobuf: proto: cannot parse invalid wire-format data"},
		{name: "protobuf/truncated", format: FormatProtobuf, value: validPB[:len(validPB)-1],
			kind: KindDecode, wantErr: "decode protobuf: proto: cannot parse invalid wire-format data"},
		{name: "protobuf/invalid UTF-8 string", format: FormatProtobuf, value: badUTF8,
			kind: KindDecode, wantErr: "decode protobuf: ", prefix: true},
		{name: "protobuf/json event", format: FormatProtobuf, value: js(valid),
			kind: KindDecode, wantErr: "decode protobuf: proto: cannot parse invalid wire-format data"},
		// A tab is field 1 with wire type fixed64, so this JSON document is
		// also a well-formed protobuf message made of one unknown field:
		// only validation can tell.
		{name: "protobuf/json that parses as protobuf", format: FormatProtobuf, value: []byte("\t{\"a\": 1}"),
			kind: KindInvalid, wantErr: "invalid event: metric is empty"},
		{name: "protobuf/empty value", format: FormatProtobuf, value: nil,
			kind: KindInvalid, wantErr: "invalid event: metric is empty"},
		{name: "protobuf/missing time", format: FormatProtobuf, value: pb(with(func(ev *ratchetv1.Event) { ev.Time = nil })),
			kind: KindInvalid, wantErr: "invalid event: time is missing"},
		{name: "protobuf/missing metric", format: FormatProtobuf, value: pb(with(func(ev *ratchetv1.Event) { ev.Metric = "" })),
			kind: KindInvalid, wantErr: "invalid event: metric is empty"},
		{name: "protobuf/metric too long", format: FormatProtobuf, value: pb(with(func(ev *ratchetv1.Event) { ev.Metric = strings.Repeat("m", 250) })),
			kind: KindInvalid, wantErr: "invalid event: metric is 250 bytes (max 200)"},
		{name: "protobuf/NaN", format: FormatProtobuf, value: pb(with(func(ev *ratchetv1.Event) { ev.Value = math.NaN() })),
			kind: KindInvalid, wantErr: "invalid event: value is NaN"},
		{name: "protobuf/time out of range", format: FormatProtobuf, value: pb(with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{Seconds: 1e12} })),
			kind: KindInvalid, wantErr: "invalid event: time is after 9999-12-31T23:59:59Z"},

		{name: "json/valid", format: FormatJSON, value: js(valid), want: valid},
		{name: "json/minimal", format: FormatJSON, value: []byte(`{"metric":"m","time":"2026-01-02T03:04:05.600Z"}`), want: minimal},
		{name: "json/invalid json", format: FormatJSON, value: []byte(`{"metric":`),
			kind: KindDecode, wantErr: "decode json: proto: unexpected EOF"},
		{name: "json/not json", format: FormatJSON, value: []byte(`metric=m`),
			kind: KindDecode, wantErr: "decode json: proto: syntax error (line 1:1): invalid value metric"},
		{name: "json/protobuf bytes", format: FormatJSON, value: validPB,
			kind: KindDecode, wantErr: "decode json: proto: syntax error", prefix: true},
		{name: "json/empty value", format: FormatJSON, value: nil,
			kind: KindDecode, wantErr: "decode json: proto: syntax error (line 1:1): unexpected token"},
		{name: "json/unknown field", format: FormatJSON, value: []byte(`{"metric":"m","bogus":1}`),
			kind: KindDecode, wantErr: `decode json: proto: (line 1:15): unknown field "bogus"`},
		{name: "json/missing time", format: FormatJSON, value: []byte(`{"metric":"m","value":2}`),
			kind: KindInvalid, wantErr: "invalid event: time is missing"},
		{name: "json/missing metric", format: FormatJSON, value: []byte(`{"value":2,"time":"2026-01-02T03:04:05Z"}`),
			kind: KindInvalid, wantErr: "invalid event: metric is empty"},
		{name: "json/metric too long", format: FormatJSON, value: js(with(func(ev *ratchetv1.Event) { ev.Metric = strings.Repeat("m", 250) })),
			kind: KindInvalid, wantErr: "invalid event: metric is 250 bytes (max 200)"},
		{name: "json/NaN", format: FormatJSON, value: []byte(`{"metric":"m","value":"NaN","time":"2026-01-02T03:04:05Z"}`),
			kind: KindInvalid, wantErr: "invalid event: value is NaN"},
		{name: "json/Infinity", format: FormatJSON, value: []byte(`{"metric":"m","value":"-Infinity","time":"2026-01-02T03:04:05Z"}`),
			kind: KindInvalid, wantErr: "invalid event: value is -Inf"},
		{name: "json/time out of range", format: FormatJSON, value: []byte(`{"metric":"m","time":"10000-01-01T00:00:00Z"}`),
			kind: KindDecode, wantErr: `decode json: proto: (line 1:22): invalid google.protobuf.Timestamp value "10000-01-01T00:00:00Z"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := Decode(tt.format, tt.value)
			if tt.want != nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if unknown := ev.ProtoReflect().GetUnknown(); tt.unknown != (len(unknown) > 0) {
					t.Fatalf("unknown fields %q, want some: %v", unknown, tt.unknown)
				}
				ev.ProtoReflect().SetUnknown(nil)
				if !proto.Equal(ev, tt.want) {
					t.Fatalf("Decode = %v, want %v", ev, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode = %v, want error", ev)
			}
			if ev != nil {
				t.Errorf("Decode returned event %v with error", ev)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %q is not *Error", err, err)
			}
			if !IsPoison(err) {
				t.Errorf("IsPoison(%q) = false", err)
			}
			if e.Kind != tt.kind {
				t.Errorf("Kind = %q, want %q (%v)", e.Kind, tt.kind, err)
			}
			if got := err.Error(); tt.prefix && !strings.HasPrefix(got, tt.wantErr) || !tt.prefix && got != tt.wantErr {
				t.Errorf("Error() = %q, want %q (prefix %v)", got, tt.wantErr, tt.prefix)
			}
			if e.Kind == KindDecode && e.Err == nil {
				t.Errorf("decode error without cause")
			}
		})
	}
}

func TestDecodeUnknownFormat(t *testing.T) {
	for _, format := range []string{"avro", "JSON", "proto"} {
		t.Run(format, func(t *testing.T) {
			_, err := Decode(format, mustEncode(t, FormatProtobuf, sample()))
			if !errors.Is(err, ErrUnknownFormat) {
				t.Fatalf("Decode(%q) error = %v, want ErrUnknownFormat", format, err)
			}
			if IsPoison(err) {
				t.Errorf("unknown format is a configuration error, not poison")
			}
			if _, err := Encode(format, sample()); !errors.Is(err, ErrUnknownFormat) {
				t.Errorf("Encode(%q) error = %v, want ErrUnknownFormat", format, err)
			}
		})
	}
}

// TestDecodeErrorIsShort checks that parser messages quoting the input are
// cut before they reach a DLQ header.
func TestDecodeErrorIsShort(t *testing.T) {
	long := strings.Repeat("a", 5000)
	tests := []struct {
		name   string
		format string
		value  string
	}{
		{"json/long unknown field", FormatJSON, `{"` + long + `":1}`},
		{"json/long bare token", FormatJSON, `{"metric":` + long + `}`},
		{"json/long trailing string", FormatJSON, `{"metric":"m"} "` + long + `"`},
		{"json/binary token", FormatJSON, "{\"metric\":\x00\x01\x02\n\r\t}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.format, []byte(tt.value))
			if err == nil {
				t.Fatal("Decode succeeded")
			}
			msg := err.Error()
			if len(msg) > 256 {
				t.Errorf("error is %d bytes: %q", len(msg), msg)
			}
			if strings.Contains(msg, strings.Repeat("a", maxCauseBytes)) {
				t.Errorf("error repeats %d bytes of input: %q", maxCauseBytes, msg)
			}
			for _, r := range msg {
				if r < 0x20 || r == 0x7f {
					t.Fatalf("error contains control character %q: %q", r, msg)
				}
			}
		})
	}
}

func TestEncode(t *testing.T) {
	for _, format := range []string{FormatProtobuf, FormatJSON} {
		t.Run(format+"/round trip", func(t *testing.T) {
			want := sample()
			got, err := Decode(format, mustEncode(t, format, want))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("round trip = %v, want %v", got, want)
			}
		})
		t.Run(format+"/invalid event is encoded", func(t *testing.T) {
			b := mustEncode(t, format, &ratchetv1.Event{Value: math.Inf(1)})
			if _, err := Decode(format, b); !IsPoison(err) {
				t.Fatalf("Decode error = %v, want poison", err)
			}
		})
		t.Run(format+"/nil event", func(t *testing.T) {
			if _, err := Encode(format, nil); err == nil {
				t.Fatal("Encode(nil) succeeded")
			}
		})
	}
	t.Run("protobuf/deterministic", func(t *testing.T) {
		ev := sample()
		for i := range 50 {
			ev.Labels[string(rune('a'+i%26))+strings.Repeat("k", i)] = "v"
		}
		first := mustEncode(t, FormatProtobuf, ev)
		for range 10 {
			if b := mustEncode(t, FormatProtobuf, ev); string(b) != string(first) {
				t.Fatal("protobuf encoding differs between calls")
			}
		}
	})
	t.Run("json/time out of range", func(t *testing.T) {
		_, err := Encode(FormatJSON, with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{Seconds: 1e12} }))
		if err == nil || !strings.HasPrefix(err.Error(), "encode json: ") {
			t.Fatalf("Encode error = %v, want encode json: ...", err)
		}
	})
}
