package event

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

// MaxMetricBytes is the longest metric name the contract allows, in bytes.
const MaxMetricBytes = 200

// Range of google.protobuf.Timestamp: 0001-01-01T00:00:00Z to
// 9999-12-31T23:59:59.999999999Z, as in timestamppb.
const (
	minTimeSeconds = -62135596800
	maxTimeSeconds = 253402300799
)

// Validate checks ev against the event contract:
//   - metric is 1..MaxMetricBytes bytes of UTF-8 without NUL bytes (NUL
//     cannot be stored in a PostgreSQL text column);
//   - value is finite;
//   - time is present and within the range of google.protobuf.Timestamp;
//   - id and labels are optional and unchecked.
//
// It returns nil or an *Error of kind KindInvalid naming the first broken
// rule.
func Validate(ev *ratchetv1.Event) error {
	if ev == nil {
		return invalid("event is nil")
	}
	m := ev.GetMetric()
	switch {
	case m == "":
		return invalid("metric is empty")
	case len(m) > MaxMetricBytes:
		return invalid(fmt.Sprintf("metric is %d bytes (max %d)", len(m), MaxMetricBytes))
	case !utf8.ValidString(m):
		return invalid("metric is not valid UTF-8")
	case strings.IndexByte(m, 0) >= 0:
		return invalid("metric contains a NUL byte")
	}
	switch v := ev.GetValue(); {
	case math.IsNaN(v):
		return invalid("value is NaN")
	case math.IsInf(v, 1):
		return invalid("value is +Inf")
	case math.IsInf(v, -1):
		return invalid("value is -Inf")
	}
	ts := ev.GetTime()
	if ts == nil {
		return invalid("time is missing")
	}
	switch s, n := ts.GetSeconds(), ts.GetNanos(); {
	case s < minTimeSeconds:
		return invalid("time is before 0001-01-01T00:00:00Z")
	case s > maxTimeSeconds:
		return invalid("time is after 9999-12-31T23:59:59Z")
	case n < 0 || n >= 1e9:
		return invalid(fmt.Sprintf("time nanos %d out of range [0, 999999999]", n))
	}
	// The checks above mirror CheckValid so the reason reads well; keep
	// CheckValid as the authority in case it ever grows a rule.
	if err := ts.CheckValid(); err != nil {
		e := invalid("time is invalid: " + shorten(err.Error(), maxCauseBytes))
		e.Err = err
		return e
	}
	return nil
}
