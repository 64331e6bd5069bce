package event

import (
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	ratchetv1 "ratchet/messages/ratchet/v1"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		ev      *ratchetv1.Event
		wantErr string // "" means valid
	}{
		{"valid", sample(), ""},
		{"no id no labels", &ratchetv1.Event{Metric: "m", Time: timestamppb.New(eventTime)}, ""},
		{"zero value", with(func(ev *ratchetv1.Event) { ev.Value = 0 }), ""},
		{"negative zero", with(func(ev *ratchetv1.Event) { ev.Value = math.Copysign(0, -1) }), ""},
		{"max float", with(func(ev *ratchetv1.Event) { ev.Value = -math.MaxFloat64 }), ""},
		{"metric 200 bytes", with(func(ev *ratchetv1.Event) { ev.Metric = strings.Repeat("é", 100) }), ""},
		{"time at epoch", with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{} }), ""},
		{"earliest time", with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{Seconds: minTimeSeconds} }), ""},
		{"latest time", with(func(ev *ratchetv1.Event) {
			ev.Time = &timestamppb.Timestamp{Seconds: maxTimeSeconds, Nanos: 999_999_999}
		}), ""},
		{"empty label key and value", with(func(ev *ratchetv1.Event) { ev.Labels = map[string]string{"": ""} }), ""},

		{"nil event", nil, "invalid event: event is nil"},
		{"empty metric", with(func(ev *ratchetv1.Event) { ev.Metric = "" }), "invalid event: metric is empty"},
		{"metric 201 bytes", with(func(ev *ratchetv1.Event) { ev.Metric = strings.Repeat("é", 100) + "x" }),
			"invalid event: metric is 201 bytes (max 200)"},
		{"metric 250 bytes", with(func(ev *ratchetv1.Event) { ev.Metric = strings.Repeat("m", 250) }),
			"invalid event: metric is 250 bytes (max 200)"},
		{"metric invalid UTF-8", with(func(ev *ratchetv1.Event) { ev.Metric = "a\xffb" }), "invalid event: metric is not valid UTF-8"},
		{"metric with NUL", with(func(ev *ratchetv1.Event) { ev.Metric = "a\x00b" }), "invalid event: metric contains a NUL byte"},
		{"NaN", with(func(ev *ratchetv1.Event) { ev.Value = math.NaN() }), "invalid event: value is NaN"},
		{"+Inf", with(func(ev *ratchetv1.Event) { ev.Value = math.Inf(1) }), "invalid event: value is +Inf"},
		{"-Inf", with(func(ev *ratchetv1.Event) { ev.Value = math.Inf(-1) }), "invalid event: value is -Inf"},
		{"missing time", with(func(ev *ratchetv1.Event) { ev.Time = nil }), "invalid event: time is missing"},
		{"time before year 1", with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{Seconds: minTimeSeconds - 1} }),
			"invalid event: time is before 0001-01-01T00:00:00Z"},
		{"time after year 9999", with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{Seconds: maxTimeSeconds + 1} }),
			"invalid event: time is after 9999-12-31T23:59:59Z"},
		{"negative nanos", with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{Nanos: -1} }),
			"invalid event: time nanos -1 out of range [0, 999999999]"},
		{"nanos one second", with(func(ev *ratchetv1.Event) { ev.Time = &timestamppb.Timestamp{Nanos: 1e9} }),
			"invalid event: time nanos 1000000000 out of range [0, 999999999]"},
		{"first rule wins", &ratchetv1.Event{Value: math.NaN()}, "invalid event: metric is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.ev)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				// Anything Validate accepts must also satisfy timestamppb.
				if err := tt.ev.GetTime().CheckValid(); err != nil {
					t.Fatalf("Validate accepted a time CheckValid refuses: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want %q", tt.wantErr)
			}
			if err.Error() != tt.wantErr {
				t.Errorf("Validate = %q, want %q", err, tt.wantErr)
			}
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindInvalid {
				t.Errorf("Validate error %#v is not an *Error of kind %q", err, KindInvalid)
			}
		})
	}
}
