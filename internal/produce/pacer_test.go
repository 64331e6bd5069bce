package produce

import (
	"testing"
	"time"
)

func TestPacerDue(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	tests := []struct {
		name string
		rate float64
		at   time.Duration
		sent int64
		want int64
	}{
		{"first record at once", 500, 0, 0, 1},
		{"before start", 500, -ms, 0, 0},
		{"between slots", 500, ms, 1, 0},
		{"exactly on a slot", 500, 2 * ms, 1, 1},
		{"several due", 500, 20 * ms, 1, 10},
		{"already ahead", 500, 20 * ms, 11, 0},
		{"capped at burst", 500, time.Second, 1, 50},
		{"slow rate", 0.5, 1999 * ms, 1, 0},
		{"slow rate second", 0.5, 2 * time.Second, 1, 1},
		{"slow rate burst is one", 0.5, time.Minute, 1, 1},
		{"high rate", 1e6, 10 * ms, 0, 10001},
		{"unlimited", 0, 0, 123456, unlimitedChunk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(tt.rate, t0)
			if tt.name == "high rate" {
				p.burst = 1 << 40 // look at the schedule alone
			}
			if got := p.due(t0.Add(tt.at), tt.sent); got != tt.want {
				t.Errorf("due(+%s, sent=%d) at %v/s = %d, want %d", tt.at, tt.sent, tt.rate, got, tt.want)
			}
		})
	}
}

func TestPacerForgetsMissedSlots(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := newPacer(500, t0)
	now := t0.Add(time.Second) // stalled for a second with 1 sent
	if got := p.due(now, 1); got != 50 {
		t.Fatalf("due after stall = %d, want burst 50", got)
	}
	// After sending the burst nothing more is due until the next slot, 2 ms
	// later: the 450 missed slots are not made up.
	if got := p.due(now, 51); got != 0 {
		t.Fatalf("due right after burst = %d, want 0", got)
	}
	if next := p.next(51); next.Sub(now) != 2*time.Millisecond {
		t.Fatalf("next slot after burst is %s after now, want 2ms", next.Sub(now))
	}
	if got := p.due(p.next(51), 51); got != 1 {
		t.Fatalf("due at next slot = %d, want 1", got)
	}
}

// TestPacerSchedule drives the pacer with a simulated clock the way Run
// does: send what is due, otherwise jump to the next slot. 250 records at
// 500/s must span 0.498 s (the first goes out at once).
func TestPacerSchedule(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		count int64
		span  time.Duration
	}{
		{"500 per second", 500, 250, 498 * time.Millisecond},
		{"3 per second", 3, 10, 3 * time.Second},
		{"100k per second", 100_000, 50_000, 499_990 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := t0
			p := newPacer(tt.rate, t0)
			var sent, wakeups int64
			var last time.Time
			for sent < tt.count {
				n := p.due(now, sent)
				if n == 0 {
					next := p.next(sent)
					if !next.After(now) {
						t.Fatalf("nothing due at %s but next slot %s is not later", now, next)
					}
					now = next
					wakeups++
					continue
				}
				n = min(n, tt.count-sent)
				sent += n
				last = now
			}
			if got := last.Sub(t0); got < tt.span-time.Microsecond || got > tt.span+time.Microsecond {
				t.Errorf("last record at +%s, want +%s", got, tt.span)
			}
			if wakeups > tt.count {
				t.Errorf("%d wakeups for %d records", wakeups, tt.count)
			}
		})
	}
}
