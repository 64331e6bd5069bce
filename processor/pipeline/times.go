package pipeline

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"

	"ratchet/config"
)

// timeBounds is what toTime checks a number against: the window of its
// pipeline (pipelines[i].epoch_millis_window) around a reference time,
// the record's Kafka timestamp. The reference is the record's own, not the
// clock's, so that a replay, a retry or a backfill a year later decides
// the same as the first try did.
type timeBounds struct {
	ref          time.Time // zero: the record has no timestamp (then only PostgreSQL's range applies)
	past, future time.Duration
	key          string // the window's key path, for messages
}

// The times a pipeline can write, in Unix seconds: from PostgreSQL's
// lowest timestamptz, 4714-11-24 BC (Julian day 0; its docs say 4713 BC),
// to the last second whose microseconds pgx can encode (it computes
// t.Unix()*1e6 in an int64, which overflows silently in 294247 AD, before
// PostgreSQL's own end in 294276 AD).
const (
	minUnix = -210866803200
	maxUnix = math.MaxInt64/1_000_000 - 1 // 294247-01-10
	// rangeText is the range for messages.
	rangeText = "beyond what a timestamptz holds (4713 BC to 294246 AD)"
)

// toTime converts a CEL value to the time it means, for every place of a
// pipeline that takes a time: a rollup's time, a timestamp column of an
// upsert or a rollup group, and the upsert version. It accepts
//
//   - a CEL timestamp (record.timestamp, timestamp("..."), a decoded Avro,
//     Protobuf or Event time);
//   - a string in RFC 3339 with a Z or an offset, with or without
//     fractional seconds, "T" or a space between date and time
//     (2026-12-04T16:30:00Z, 2026-12-04 16:30:00.5+01:00, and
//     PostgreSQL's own 2026-12-04 16:30:00+00); a time without an offset
//     is refused: which zone it meant is not in the record;
//   - epoch milliseconds as an int, a uint, a double or a string of
//     digits. A number is a time only within b's window of the record's
//     timestamp: epoch seconds (which read as milliseconds land in January
//     1970) and microseconds or nanoseconds (tens of thousands of years
//     ahead, or beyond PostgreSQL) are refused, not bucketed.
//
// Every time must lie in what PostgreSQL's timestamptz holds and pgx
// encodes (4713 BC to 294246 AD). An error says
// what was assumed and, for a number, which unit it probably is; it does
// not quote the value.
func toTime(v ref.Val, b timeBounds) (time.Time, error) {
	switch x := v.(type) {
	case types.Timestamp:
		return inRange(x.Time)
	case types.String:
		s := strings.TrimSpace(string(x))
		if looksNumeric(s) {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return time.Time{}, errors.New("a string of digits that is no number of epoch milliseconds")
			}
			if i, err := strconv.ParseInt(s, 10, 64); err == nil {
				return fromMillis(time.UnixMilli(i), float64(i), b)
			}
			return fromMillisFloat(f, b)
		}
		t, err := parseTime(s)
		if err != nil {
			return time.Time{}, err
		}
		return inRange(t)
	case types.Int:
		return fromMillis(time.UnixMilli(int64(x)), float64(x), b)
	case types.Uint:
		if uint64(x) > math.MaxInt64 {
			return fromMillisFloat(float64(x), b)
		}
		return fromMillis(time.UnixMilli(int64(x)), float64(x), b)
	case types.Double:
		return fromMillisFloat(float64(x), b)
	case types.Null:
		return time.Time{}, errors.New("no time (null)")
	}
	return time.Time{}, fmt.Errorf("a %s is not a time (a timestamp, an RFC 3339 string or epoch milliseconds)", v.Type().TypeName())
}

// timeLayouts are the string forms toTime reads; each has an offset.
var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07", // PostgreSQL's output: +00, +05:30 reads with the one above
	"2006-01-02T15:04:05.999999999Z07",
}

func parseTime(s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	if isWallTime(s) {
		return time.Time{}, errors.New("a time without a zone: write Z or an offset (2006-01-02T15:04:05Z)")
	}
	return time.Time{}, errors.New("a string that is not an RFC 3339 time (2006-01-02T15:04:05Z) nor epoch milliseconds")
}

// wallLayouts are the forms of a time without a zone.
var wallLayouts = []string{"2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999"}

// isWallTime reports whether s is a date and time without a zone, which
// a timestamp (without time zone) column takes as it is.
func isWallTime(s string) bool {
	for _, l := range wallLayouts {
		if _, err := time.Parse(l, strings.TrimSpace(s)); err == nil {
			return true
		}
	}
	return false
}

// looksNumeric reports whether s is written as a number (digits, a sign,
// a point, an exponent), not as a date.
func looksNumeric(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9', c == '.', c == 'e', c == 'E':
		case (c == '-' || c == '+') && (i == 0 || s[i-1] == 'e' || s[i-1] == 'E'):
		default:
			return false
		}
	}
	return true
}

func fromMillisFloat(f float64, b timeBounds) (time.Time, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f/1000 < minUnix || f/1000 >= maxUnix+1 {
		return time.Time{}, millisError(f, rangeText)
	}
	// Whole milliseconds, then the fraction to the microsecond PostgreSQL
	// keeps: f*1000 itself could overflow an int64.
	whole := math.Floor(f)
	t := time.UnixMilli(int64(whole)).Add(time.Duration(math.Round((f-whole)*1000)) * time.Microsecond)
	return fromMillis(t, f, b)
}

// fromMillis checks t, the time of f epoch milliseconds, against
// PostgreSQL's range and b.
func fromMillis(t time.Time, f float64, b timeBounds) (time.Time, error) {
	if _, err := inRange(t); err != nil {
		return time.Time{}, millisError(f, rangeText)
	}
	if b.ref.IsZero() {
		return t, nil
	}
	switch {
	case b.past > 0 && t.Before(b.ref.Add(-b.past)):
		return time.Time{}, millisError(f, fmt.Sprintf("%s, more than %s before the record's timestamp (%s.past)",
			day(t), fmtDays(b.past), b.key))
	case b.future > 0 && t.After(b.ref.Add(b.future)):
		return time.Time{}, millisError(f, fmt.Sprintf("%s, more than %s after the record's timestamp (%s.future)",
			day(t), fmtDays(b.future), b.key))
	}
	return t, nil
}

// millisError explains why f epoch milliseconds is no time, with the unit
// its size suggests.
func millisError(f float64, why string) error {
	msg := "epoch milliseconds: " + why
	switch a := math.Abs(f); {
	case a >= 1e8 && a < 1e11:
		msg += ": epoch seconds? multiply by 1000"
	case a >= 1e14 && a < 1e17:
		msg += ": epoch microseconds? divide by 1000"
	case a >= 1e17 && a < 1e20:
		msg += ": epoch nanoseconds? divide by 1000000"
	}
	return errors.New(msg)
}

// inRange returns t when PostgreSQL's timestamptz, and pgx's encoding of
// it, can hold it.
func inRange(t time.Time) (time.Time, error) {
	if u := t.Unix(); u < minUnix || u > maxUnix {
		return time.Time{}, errors.New("a time " + rangeText)
	}
	return t, nil
}

// day is t's date, for messages: enough to see the unit, not the value.
func day(t time.Time) string {
	t = t.UTC()
	if y := t.Year(); y > 9999 || y < 0 {
		return "year " + strconv.Itoa(y)
	}
	return t.Format("2006-01-02")
}

// fmtDays writes d in days when it is whole days (7305d), else as Go does.
func fmtDays(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

// bounds is the time bounds of e's pipeline for the record of act.
func (e *expr) bounds(act interpreter.Activation) timeBounds {
	b := e.times
	// A record without a timestamp has none here, or one at or before the
	// epoch (librdkafka's -1).
	if a, ok := act.(*recordActivation); ok && a.rec.Timestamp.UnixMilli() > 0 {
		b.ref = a.rec.Timestamp
	}
	return b
}

// boundsOf is the time bounds (without a reference yet) of pipeline i's
// configuration.
func boundsOf(pc config.Pipeline) timeBounds {
	w := pc.Window()
	return timeBounds{past: w.Past, future: w.Future, key: "epoch_millis_window"}
}
