package actors

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/internal/metrics"
	"ratchet/internal/testenv"
)

// TestGuardTrips: the guard trips when, in the window, at least
// min_failures records failed and more than max_ratio of them; an
// ordinary poison rate, or max_ratio 1, never trips it; failures that
// slid out of the window no longer count.
func TestGuardTrips(t *testing.T) {
	def := GuardLimits{MaxRatio: 0.5, MinFailures: 100, Window: 1000}
	cases := []struct {
		name   string
		limits GuardLimits
		fails  func(i int) bool
		n      int
		tripAt int // index of the failure that trips; -1 never
	}{
		{"every record fails", def, func(int) bool { return true }, 5000, 99},
		{"2 % poison", def, func(i int) bool { return i%50 == 3 }, 100_000, -1},
		{"one in three", def, func(i int) bool { return i%3 == 0 }, 100_000, -1},
		{"two in three", def, func(i int) bool { return i%3 != 0 }, 5000, 99},
		{"max_ratio 1 never trips", GuardLimits{MaxRatio: 1, MinFailures: 100, Window: 1000}, func(int) bool { return true }, 5000, -1},
		{"bursts shorter than min_failures slide out", def, func(i int) bool { return i%2000 < 90 }, 100_000, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGuard(metrics.New(prometheus.NewRegistry()), slog.New(slog.NewTextHandler(io.Discard, nil)))
			g.Watch("p", "t", tc.limits)
			failures := 0
			for i := range tc.n {
				if !tc.fails(i) {
					g.Applied("t", 1)
					continue
				}
				if g.Failed("p", errors.New("bad")) {
					if failures != tc.tripAt {
						t.Fatalf("tripped at failure %d (record %d), want %d", failures, i, tc.tripAt)
					}
					if g.Held("t") == nil || len(g.Tripped()) != 1 || g.Reason() == "" {
						t.Fatalf("tripped but not held")
					}
					if !g.Failed("p", errors.New("bad")) {
						t.Fatalf("a tripped guard let a failure through")
					}
					return
				}
				failures++
			}
			if tc.tripAt >= 0 {
				t.Fatalf("never tripped, want at failure %d", tc.tripAt)
			}
			if g.Held("t") != nil || g.Reason() != "" {
				t.Fatalf("held without tripping")
			}
		})
	}
}

// An unwatched pipeline, a nil guard, never trips.
func TestGuardUnwatched(t *testing.T) {
	var nilGuard *Guard
	if nilGuard.Failed("p", errors.New("x")) || nilGuard.Held("t") != nil || nilGuard.Reason() != "" {
		t.Fatal("a nil guard holds")
	}
	g := NewGuard(metrics.New(prometheus.NewRegistry()), slog.New(slog.NewTextHandler(io.Discard, nil)))
	for range 1000 {
		if g.Failed("other", errors.New("x")) {
			t.Fatal("an unwatched pipeline tripped")
		}
	}
}

// TestGuardSampleKeepsValuesOut: the reason the guard logs (and shows) as
// its sample quotes no record value unless log.include_values.
func TestGuardSampleKeepsValuesOut(t *testing.T) {
	const secret = "alice@example.com"
	reason := errors.New(`pipeline p: record t[0]@7: upsert.columns.email: invalid input syntax for type uuid: "` + secret + `"`)
	for _, include := range []bool{false, true} {
		rec := testenv.NewLogRecorder(slog.LevelDebug)
		g := NewGuard(metrics.New(prometheus.NewRegistry()), rec.Logger())
		g.IncludeValues = include
		g.Watch("p", "t", GuardLimits{MaxRatio: 0.5, MinFailures: 1, Window: 10})
		if !g.Failed("p", reason) {
			t.Fatal("the guard did not trip")
		}
		lines := rec.Lines("pipeline failure guard tripped: its topic is held until the configuration is fixed and ratchet restarted")
		if len(lines) != 1 {
			t.Fatalf("%d trip lines, want 1", len(lines))
		}
		sample := fmt.Sprint(lines[0].Attrs["sample"])
		if got := strings.Contains(sample, secret) || strings.Contains(g.Tripped()[0].Sample, secret); got != include {
			t.Errorf("include_values %v: the sample %q quotes the value: %v", include, sample, got)
		}
		if !strings.Contains(sample, "upsert.columns.email") {
			t.Errorf("the sample %q lost the key path", sample)
		}
	}
}
