// Package event turns Kafka record values into ratchet events and back.
//
// A record value is either the protobuf binary encoding of
// ratchet.v1.Event (FormatProtobuf, the default) or its canonical JSON form
// (FormatJSON), chosen per topic in the configuration; FormatRaw decodes
// nothing. ParseFrame reads the Confluent Schema Registry wire format
// around such a value (internal/schemareg looks its schema id up). Decode
// parses the value and then applies the rules of the event contract with Validate, so
// a returned event is always one a processor may apply.
//
// Every error Decode returns for a record is an *Error: the record is
// poison, retrying it cannot help, and it belongs in the dead-letter topic.
// The error text is written into the ratchet.error DLQ header, so it is
// kept short and never repeats more than a few bytes of the input.
//
// Decoding alone proves little: proto.Unmarshal accepts many byte strings
// that were never meant as protobuf (an empty value, some JSON documents,
// random bytes) and returns an empty or garbage event. Validation is what
// rejects those, which is why Decode always validates.
package event

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// Record value formats, as spelled in the kafka.format configuration key:
// the one definition that configuration, decoders, the generator and the
// command line share.
const (
	// FormatProtobuf is the protobuf binary encoding of ratchet.v1.Event.
	FormatProtobuf = "protobuf"
	// FormatJSON is the canonical JSON form of ratchet.v1.Event (protojson).
	FormatJSON = "json"
	// FormatRaw is any bytes: nothing is decoded, the processor gets the
	// value as it is (processor.Record.Value). Decode refuses it; a
	// Decoder for it decodes nothing.
	FormatRaw = "raw"
)

// ErrUnknownFormat is returned (wrapped) by Decode and Encode for a format
// other than FormatProtobuf, FormatJSON or "". It is a configuration error,
// not a property of the record, so it is not poison.
var ErrUnknownFormat = errors.New("unknown event format")

var (
	protoUnmarshal = proto.UnmarshalOptions{}
	// DiscardUnknown is false: an unknown JSON field is more likely a typo
	// or a document of another type than a field from a newer schema.
	jsonUnmarshal = protojson.UnmarshalOptions{DiscardUnknown: false}
	// Deterministic so that equal events (map order aside) encode to equal
	// bytes, which keeps produced test data reproducible.
	protoMarshal = proto.MarshalOptions{Deterministic: true}
	jsonMarshal  = protojson.MarshalOptions{}
)

// Decode parses value in format and validates the result. An empty format
// means FormatProtobuf. On failure it returns a nil event and an *Error of
// kind KindDecode (the value does not parse) or KindInvalid (it parses but
// breaks a rule of the contract); an unknown format returns an error
// wrapping ErrUnknownFormat instead. Decode never panics and does not keep
// a reference to value.
func Decode(format string, value []byte) (*ratchetv1.Event, error) {
	return decode(format, value, nil)
}

// Decoder decodes the records of one stream (one partition) like Decode,
// and shares the strings that repeat between its records (metric names,
// label keys and values) instead of allocating them for every event. The
// shared strings are immutable, so events may outlive the Decoder. A
// Decoder is not safe for concurrent use.
type Decoder struct {
	format string
	in     interner
	slab   []slot // events not handed out yet
}

// slot is an event with room for its time: a Decoder allocates them
// slabSize at a time, one allocation for what would be two an event. An
// event keeps its slab alive until the slab's last event is dropped, which
// for the records of a batch is soon; and each partition's Decoder keeps
// its current slab, with the events already handed out from it. At 64 a
// slab, that was 26 MB of an instance owning 1024 partitions (issue 18);
// at 16 it is a quarter, and the allocations an event stay near three.
type slot struct {
	ev ratchetv1.Event
	ts timestamppb.Timestamp
}

const slabSize = 16

// NewDecoder returns a Decoder for format (empty means FormatProtobuf).
func NewDecoder(format string) *Decoder {
	return &Decoder{format: format}
}

// DecodeRecord decodes rec.Value like Decode and sets rec.Event; with
// FormatRaw it leaves rec as it is. It implements the partition's value
// decoder.
func (d *Decoder) DecodeRecord(rec *processor.Record) error {
	if d.format == FormatRaw {
		return nil
	}
	ev, err := d.Decode(rec.Value)
	if err != nil {
		return err
	}
	rec.Event = ev
	return nil
}

// Decode is the package-level Decode with d's format.
func (d *Decoder) Decode(value []byte) (*ratchetv1.Event, error) {
	if len(d.slab) == 0 {
		d.slab = make([]slot, slabSize)
	}
	s := &d.slab[0]
	d.slab = d.slab[1:]
	return decodeInto(d.format, value, &d.in, &s.ev, &s.ts)
}

func decode(format string, value []byte, in *interner) (*ratchetv1.Event, error) {
	return decodeInto(format, value, in, new(ratchetv1.Event), nil)
}

// decodeInto decodes value into ev, a new, empty event; ts, when not nil,
// is an empty Timestamp for the event's time.
func decodeInto(format string, value []byte, in *interner, ev *ratchetv1.Event, ts *timestamppb.Timestamp) (*ratchetv1.Event, error) {
	switch format {
	case FormatProtobuf, "":
		if unmarshalFast(value, ev, in, ts) != nil {
			// Not a shape the fast path takes: proto.Unmarshal decides,
			// and words the error.
			ev.Reset()
			if err := protoUnmarshal.Unmarshal(value, ev); err != nil {
				return nil, decodeError(FormatProtobuf, err)
			}
		}
	case FormatJSON:
		if err := jsonUnmarshal.Unmarshal(value, ev); err != nil {
			return nil, decodeError(FormatJSON, err)
		}
	default:
		return nil, fmt.Errorf("decode: %w %q", ErrUnknownFormat, format)
	}
	if err := Validate(ev); err != nil {
		return nil, err
	}
	return ev, nil
}

// Encode returns the record value for ev in format (empty means
// FormatProtobuf). It does not validate ev, so producers can write
// deliberately invalid events; the JSON encoder still refuses a time
// outside the range of google.protobuf.Timestamp, and the protobuf encoder
// refuses strings that are not valid UTF-8.
func Encode(format string, ev *ratchetv1.Event) ([]byte, error) {
	if ev == nil {
		return nil, errors.New("encode: nil event")
	}
	var (
		b   []byte
		err error
	)
	switch format {
	case FormatProtobuf, "":
		format = FormatProtobuf
		b, err = protoMarshal.Marshal(ev)
	case FormatJSON:
		b, err = jsonMarshal.Marshal(ev)
	default:
		return nil, fmt.Errorf("encode: %w %q", ErrUnknownFormat, format)
	}
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", format, err)
	}
	return b, nil
}
