package event

import (
	"errors"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// This file is the fast path of protobuf decoding. proto.Unmarshal walks
// the message by reflection-driven tables and costs most of the engine's
// per-record CPU after Poll itself; the event has five fields, so a direct
// walk of the wire format does the same work in a fraction of the time and
// allocations.
//
// The fast path accepts only the shape producers write: fields 1 to 5 with
// their declared wire types, a Timestamp with fields 1 and 2, map entries
// with fields 1 and 2, all strings valid UTF-8. Anything else (an unknown
// field, a wire-type mismatch, a group, a malformed length) returns
// errSlowPath and the caller decodes the value again with proto.Unmarshal,
// which stays the authority on every case the fast path does not take, and
// on every error text. What the fast path accepts it decodes exactly as
// proto.Unmarshal does (last value wins for scalars, repeated time fields
// merge, last key wins in the map); FuzzFastPathMatchesProtoUnmarshal holds
// it to that.

// errSlowPath means "not a shape the fast path takes"; never a verdict on
// the value.
var errSlowPath = errors.New("event: not on the fast path")

// Field numbers of ratchet.v1.Event, google.protobuf.Timestamp and a map
// entry.
const (
	fieldID     = 1
	fieldMetric = 2
	fieldValue  = 3
	fieldTime   = 4
	fieldLabels = 5

	fieldSeconds = 1
	fieldNanos   = 2

	fieldKey = 1
	fieldVal = 2
)

// interner shares the bytes of strings that repeat from record to record
// (metric names, label keys and values), so a busy partition does not
// allocate the same few strings for every event. It is bounded: past
// maxInterned distinct strings it stops adding, and strings longer than
// maxInternedLen are never shared. Not safe for concurrent use; each
// Decoder has its own.
type interner struct {
	m map[string]string
}

const (
	maxInterned    = 4096
	maxInternedLen = 64
)

func (in *interner) str(b []byte) string {
	if in == nil || len(b) > maxInternedLen {
		return string(b)
	}
	if s, ok := in.m[string(b)]; ok { // no allocation for the lookup
		return s
	}
	s := string(b)
	if in.m == nil {
		in.m = make(map[string]string)
	}
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}

// unmarshalFast decodes value into ev (a new, empty event) or returns
// errSlowPath. in may be nil. spare, when not nil, is an empty Timestamp
// to use for the event's time instead of allocating one.
func unmarshalFast(value []byte, ev *ratchetv1.Event, in *interner, spare *timestamppb.Timestamp) error {
	b := value
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		// The field's bytes first, by its declared wire type.
		var (
			v []byte
			x uint64
		)
		switch {
		case typ == protowire.BytesType && (num == fieldID || num == fieldMetric || num == fieldTime || num == fieldLabels):
			v, n = protowire.ConsumeBytes(b)
		case typ == protowire.Fixed64Type && num == fieldValue:
			x, n = protowire.ConsumeFixed64(b)
		default:
			return errSlowPath
		}
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		switch num {
		case fieldID:
			if !utf8.Valid(v) {
				return errSlowPath
			}
			// Ids are unique per event: sharing them would only fill the
			// interner.
			ev.Id = string(v)
		case fieldMetric:
			if !utf8.Valid(v) {
				return errSlowPath
			}
			ev.Metric = in.str(v)
		case fieldValue:
			ev.Value = math.Float64frombits(x)
		case fieldTime:
			if ev.Time == nil {
				ev.Time = spare
				if ev.Time == nil {
					ev.Time = new(timestamppb.Timestamp)
				}
			}
			// A repeated message field merges into the one already read.
			if err := unmarshalTimestamp(v, ev.Time); err != nil {
				return err
			}
		case fieldLabels:
			k, val, err := unmarshalEntry(v, in)
			if err != nil {
				return err
			}
			if ev.Labels == nil {
				ev.Labels = make(map[string]string, 1)
			}
			ev.Labels[k] = val
		}
	}
	return nil
}

func unmarshalTimestamp(b []byte, ts *timestamppb.Timestamp) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || (num != fieldSeconds && num != fieldNanos) {
			return errSlowPath
		}
		b = b[n:]
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		if num == fieldSeconds {
			ts.Seconds = int64(v)
		} else {
			ts.Nanos = int32(v) // proto.Unmarshal truncates int32 varints the same way
		}
	}
	return nil
}

// unmarshalEntry decodes one map<string, string> entry; a missing key or
// value is the empty string, as in proto.Unmarshal.
func unmarshalEntry(b []byte, in *interner) (key, val string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != fieldKey && num != fieldVal) {
			return "", "", errSlowPath
		}
		b = b[n:]
		v, n := consumeString(b)
		if n < 0 {
			return "", "", errSlowPath
		}
		b = b[n:]
		if num == fieldKey {
			key = in.str(v)
		} else {
			val = in.str(v)
		}
	}
	return key, val, nil
}

// consumeString is protowire.ConsumeBytes for a proto3 string: invalid
// UTF-8 is left to proto.Unmarshal, which refuses it.
func consumeString(b []byte) ([]byte, int) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 || !utf8.Valid(v) {
		return nil, -1
	}
	return v, n
}
