package chaos

import (
	"reflect"
	"testing"
	"time"
)

func TestPlanIsDeterministic(t *testing.T) {
	for _, seed := range []uint64{0, 1, 7, 1 << 40} {
		a, b := Plan(seed, 60*time.Second), Plan(seed, 60*time.Second)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("seed %d: two plans differ:\n%s\n%s", seed, a, b)
		}
	}
	if reflect.DeepEqual(Plan(1, time.Minute).Faults, Plan(3, time.Minute).Faults) {
		t.Error("seeds 1 and 3 drew the same faults")
	}
}

// TestPlanKeepsItsRules checks, over many seeds, what the explorer relies
// on when it carries a schedule out and judges the result.
func TestPlanKeepsItsRules(t *testing.T) {
	const load = 90 * time.Second
	kinds := map[Kind]int{}
	modes := map[string]int{}
	static, dynamic := 0, 0
	for seed := range uint64(500) {
		s := Plan(seed, load)
		modes[s.Mode]++
		if len(s.Faults) < 3 {
			t.Fatalf("seed %d: %d faults, want at least 3", seed, len(s.Faults))
		}
		if !s.Members[0].Static || s.Members[1].Static {
			t.Errorf("seed %d: members %v, want m0 static and m1 dynamic", seed, s.Members)
		}
		for _, m := range s.Members {
			if m.Static {
				static++
			} else {
				dynamic++
			}
		}
		alive := startMembers
		downUntil := map[int]time.Duration{}
		var last time.Duration
		for _, f := range s.Faults {
			kinds[f.Kind]++
			if f.At < last {
				t.Fatalf("seed %d: faults out of order:\n%s", seed, s)
			}
			last = f.At
			if f.At < 3*time.Second || f.At > load {
				t.Errorf("seed %d: %s starts outside the load", seed, f)
			}
			switch f.Kind {
			case Kill, Term, Pause, ScaleDown:
				if f.Target >= len(s.Members) {
					t.Fatalf("seed %d: %s targets a member that never exists:\n%s", seed, f, s)
				}
				if f.At < downUntil[f.Target] {
					t.Errorf("seed %d: %s hits m%d while an earlier fault lasts:\n%s", seed, f, f.Target, s)
				}
				downUntil[f.Target] = f.End()
				if f.Kind == ScaleDown {
					alive--
					downUntil[f.Target] = load * 10
				}
			case ScaleUp:
				alive++
				if f.Target != startMembers || len(s.Members) != startMembers+1 {
					t.Errorf("seed %d: scale-up to m%d with %d members", seed, f.Target, len(s.Members))
				}
			case Reset:
				if s.Mode != ExactlyOnce {
					t.Errorf("seed %d: an offsets reset in %s mode", seed, s.Mode)
				}
				if f.Partition < 0 || f.Partition >= s.Partitions || f.Shift <= 0 {
					t.Errorf("seed %d: %s", seed, f)
				}
			case RegistryOutage:
				if !s.Registry {
					t.Errorf("seed %d: a registry outage in a run without a registry", seed)
				}
			case BrokerFail:
				if f.Request == "" {
					t.Errorf("seed %d: %s names no request", seed, f)
				}
			case BrokerSlow:
				if f.Request == "" || f.Delay < 100*time.Millisecond || f.Delay >= 2*time.Second {
					t.Errorf("seed %d: %s", seed, f)
				}
			}
		}
		if alive < 2 {
			t.Errorf("seed %d: %d members left at the end:\n%s", seed, alive, s)
		}
		if s.LastFaultEnd() < last {
			t.Errorf("seed %d: last fault end %s before the last start %s", seed, s.LastFaultEnd(), last)
		}
	}
	for _, k := range []Kind{Kill, Term, Pause, ScaleUp, ScaleDown, PostgresCut, PostgresSlow, PostgresLock, PostgresTerminate, BrokerFail, BrokerSlow, Reset, RegistryOutage} {
		if kinds[k] == 0 {
			t.Errorf("500 seeds never drew a %s fault", k)
		}
	}
	if modes[ExactlyOnce] == 0 || modes[AtLeastOnce] == 0 {
		t.Errorf("modes drawn: %v, want both", modes)
	}
	panics := 0
	for seed := range uint64(500) {
		if Plan(seed, load).PanicEvery > 0 {
			panics++
		}
	}
	if panics == 0 || panics == 500 {
		t.Errorf("%d of 500 runs with panics, want some", panics)
	}
	if static == 0 || dynamic == 0 {
		t.Errorf("members drawn: %d static, %d dynamic, want both", static, dynamic)
	}
}

func TestPauseLongerAndShorterThanTheSession(t *testing.T) {
	short, long := 0, 0
	for seed := range uint64(300) {
		s := Plan(seed, 90*time.Second)
		for _, f := range s.Faults {
			if f.Kind != Pause {
				continue
			}
			if f.Duration > s.SessionTimeout {
				long++
			} else {
				short++
			}
		}
	}
	if short == 0 || long == 0 {
		t.Errorf("pauses: %d shorter than the session timeout, %d longer; want both", short, long)
	}
}

// TestPipelinesDrawnWithoutPanics: pipeline runs come in both commit modes
// and both value framings, never where the panicking build would wrap the
// built-in processor (a processor of the program's own excludes them).
func TestPipelinesDrawnWithoutPanics(t *testing.T) {
	drawn := map[string]int{}
	for seed := range uint64(500) {
		s := Plan(seed, 90*time.Second)
		if !s.Pipelines {
			continue
		}
		if s.PanicEvery > 0 {
			t.Errorf("seed %d: pipelines with planned panics", seed)
		}
		drawn[s.Mode]++
		if s.Registry {
			drawn["registry"]++
		} else {
			drawn["plain"]++
		}
	}
	for _, k := range []string{ExactlyOnce, AtLeastOnce, "registry", "plain"} {
		if drawn[k] == 0 {
			t.Errorf("500 seeds never drew pipelines with %s (drawn: %v)", k, drawn)
		}
	}
}
