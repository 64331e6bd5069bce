package event

import (
	"encoding/binary"
	"fmt"
)

// This file reads the Confluent Schema Registry wire format, the framing
// Confluent's serializers (and Kafka Connect, Redpanda, ...) put around a
// value:
//
//	byte 0      magic byte 0
//	bytes 1..4  the schema id, big-endian
//	protobuf    the message indexes: a zig-zag varint count, then that many
//	            zig-zag varints (the path of the message type through the
//	            schema's nested messages); a count of 0 stands for [0], the
//	            first message of the schema
//	rest        the payload: the protobuf or JSON encoding
//
// serde.SchemaID.FromBytes in confluent-kafka-go/v2/schemaregistry/serde is
// the reference; TestFrameMatchesSerde holds ParseFrame to it. The magic
// byte 1 (a schema GUID) is not read: it belongs to the header-based ids
// the serializers do not write by default.

// MagicByte starts every value in the schema registry wire format.
const MagicByte = 0

// maxMessageIndexes bounds the message-index path a value may declare. A
// schema nests messages a few levels deep; a count in the millions is a
// broken value, and allocating for it would let one record cost memory.
const maxMessageIndexes = 64

// Frame is a value in the schema registry wire format, parsed.
type Frame struct {
	SchemaID int32
	// MessageIndexes is the path of the value's message type in its
	// schema (protobuf only): [0] is the schema's first message, [1, 0]
	// the first message nested in the second.
	MessageIndexes []int
	// Payload is the encoded value after the framing; it shares memory
	// with the value parsed.
	Payload []byte
}

// ParseFrame reads the framing of value; withIndexes says the value is
// protobuf, whose framing carries message indexes. format names the
// topic's format in the errors. Every error is an *Error of KindDecode:
// the value is poison.
func ParseFrame(value []byte, format string, withIndexes bool) (Frame, error) {
	if len(value) == 0 {
		return Frame{}, framingError(format, "empty value, want the schema registry wire format (magic byte 0, schema id)")
	}
	if value[0] != MagicByte {
		return Frame{}, framingError(format, fmt.Sprintf("no magic byte: the value starts with 0x%02x, want 0x00 and a schema id (schema registry wire format)", value[0]))
	}
	if len(value) < 5 {
		return Frame{}, framingError(format, fmt.Sprintf("truncated schema registry framing: %d bytes, want a 4-byte schema id after the magic byte", len(value)))
	}
	f := Frame{SchemaID: int32(binary.BigEndian.Uint32(value[1:5]))}
	rest := value[5:]
	if withIndexes {
		n, read := binary.Varint(rest)
		switch {
		case read <= 0:
			return Frame{}, framingError(format, fmt.Sprintf("schema id %d: unreadable message index count", f.SchemaID))
		case n < 0 || n > maxMessageIndexes:
			return Frame{}, framingError(format, fmt.Sprintf("schema id %d: message index count %d out of range 0..%d", f.SchemaID, n, maxMessageIndexes))
		}
		rest = rest[read:]
		if n == 0 {
			f.MessageIndexes = firstMessage
		} else {
			f.MessageIndexes = make([]int, n)
			for i := range f.MessageIndexes {
				idx, read := binary.Varint(rest)
				if read <= 0 || idx < 0 || idx > 1<<20 {
					return Frame{}, framingError(format, fmt.Sprintf("schema id %d: unreadable message index %d", f.SchemaID, i))
				}
				f.MessageIndexes[i] = int(idx)
				rest = rest[read:]
			}
		}
	}
	f.Payload = rest
	return f, nil
}

// SchemaIDOf returns the schema id of a value in the wire format without
// parsing the rest; ok is false when the value is not framed.
func SchemaIDOf(value []byte) (id int32, ok bool) {
	if len(value) < 5 || value[0] != MagicByte {
		return 0, false
	}
	return int32(binary.BigEndian.Uint32(value[1:5])), true
}

// AppendFrame appends the framing of a value with schema id and message
// indexes (nil for JSON) to dst, the way Confluent's serializers write it.
func AppendFrame(dst []byte, id int32, indexes []int) []byte {
	dst = append(dst, MagicByte)
	dst = binary.BigEndian.AppendUint32(dst, uint32(id))
	switch {
	case indexes == nil:
	case len(indexes) == 1 && indexes[0] == 0:
		dst = append(dst, 0)
	default:
		dst = binary.AppendVarint(dst, int64(len(indexes)))
		for _, i := range indexes {
			dst = binary.AppendVarint(dst, int64(i))
		}
	}
	return dst
}

// firstMessage is the shared [0] path; callers must not modify it.
var firstMessage = []int{0}

func framingError(format, reason string) *Error {
	return &Error{Kind: KindDecode, Format: format, Reason: reason}
}
