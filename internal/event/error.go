package event

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Kind classifies why a record value was refused.
type Kind string

const (
	// KindDecode means the value does not parse in the configured format.
	KindDecode Kind = "decode"
	// KindInvalid means the value parses but the event breaks a rule of
	// the contract (missing metric or time, non-finite value, ...).
	KindInvalid Kind = "invalid"
)

// maxCauseBytes caps the text of a decoding error taken from the parser.
// Parsers quote the offending token, which can be any length, and the text
// ends up in a Kafka header.
const maxCauseBytes = 200

// Error is the error Decode and Validate return for a poison record.
type Error struct {
	// Kind says whether the value did not parse or broke a rule.
	Kind Kind
	// Format is the format the value was decoded as; empty for errors
	// from Validate.
	Format string
	// Reason is a short, single-line, printable description: the shortened
	// parser message for KindDecode, the broken rule for KindInvalid
	// (e.g. "metric is empty").
	Reason string
	// Err is the underlying error, if any: the parser's error for
	// KindDecode, the timestamp check for an invalid time, nil otherwise.
	Err error
}

// Error returns "decode <format>: <reason>" or "invalid event: <reason>".
func (e *Error) Error() string {
	if e.Kind == KindDecode {
		return "decode " + e.Format + ": " + e.Reason
	}
	return "invalid event: " + e.Reason
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// IsPoison reports whether err, or an error it wraps, is an *Error: the
// record can never be applied as it is and must be dead-lettered rather
// than retried. Every error Decode returns for a record is poison.
func IsPoison(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

func decodeError(format string, err error) *Error {
	return &Error{Kind: KindDecode, Format: format, Reason: shorten(err.Error(), maxCauseBytes), Err: err}
}

func invalid(reason string) *Error {
	return &Error{Kind: KindInvalid, Reason: reason}
}

// shorten makes s safe for a one-line header: whitespace becomes a plain
// space (the protobuf runtime deliberately varies the space after "proto:"),
// unprintable runes and invalid UTF-8 become '?', and the result is cut on a
// rune boundary after at most max bytes, marked with "...". Trailing
// spaces are dropped.
func shorten(s string, max int) string {
	var b strings.Builder
	b.Grow(min(len(s), max+3))
	for _, r := range s {
		switch {
		case unicode.IsSpace(r):
			r = ' '
		case r == utf8.RuneError || !unicode.IsPrint(r):
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > max {
			b.WriteString("...")
			break
		}
		b.WriteRune(r)
	}
	return strings.TrimRight(b.String(), " ")
}
