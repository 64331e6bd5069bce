package event

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestError(t *testing.T) {
	cause := errors.New("proto: bad")
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"decode protobuf", &Error{Kind: KindDecode, Format: FormatProtobuf, Reason: "proto: bad", Err: cause},
			"decode protobuf: proto: bad"},
		{"decode json", &Error{Kind: KindDecode, Format: FormatJSON, Reason: "x"}, "decode json: x"},
		{"invalid", &Error{Kind: KindInvalid, Reason: "metric is empty"}, "invalid event: metric is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
			if tt.err.Err != nil && !errors.Is(tt.err, tt.err.Err) {
				t.Errorf("errors.Is(err, Err) = false")
			}
		})
	}
	if got := decodeError(FormatProtobuf, cause); !errors.Is(got, cause) {
		t.Errorf("decodeError does not wrap its cause")
	}
}

func TestIsPoison(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"other", io.EOF, false},
		{"unknown format", fmt.Errorf("decode: %w", ErrUnknownFormat), false},
		{"decode", decodeError(FormatJSON, io.EOF), true},
		{"invalid", invalid("metric is empty"), true},
		{"wrapped", fmt.Errorf("partition 3: %w", invalid("time is missing")), true},
		{"joined", errors.Join(io.EOF, invalid("value is NaN")), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsPoison(tt.err); got != tt.want {
				t.Errorf("IsPoison(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestShorten(t *testing.T) {
	tests := []struct {
		name string
		in   string
		max  int
		want string
	}{
		{"short", "proto: bad", 200, "proto: bad"},
		{"non-breaking space", "proto:\u00a0bad", 200, "proto: bad"},
		{"newline and tab", "a\nb\tc", 200, "a b c"},
		{"control", "a\x00b\x1bc", 200, "a?b?c"},
		{"invalid UTF-8", "a\xffb", 200, "a?b"},
		{"trailing space", "token ", 200, "token"},
		{"cut", strings.Repeat("x", 10), 4, "xxxx..."},
		{"cut on rune boundary", "aé", 2, "a..."},
		{"multi-byte kept", "éé", 4, "éé"},
		{"empty", "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := shorten(tt.in, tt.max); got != tt.want {
				t.Errorf("shorten(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
			}
		})
	}
}
