package gcpolicy

import (
	"math"
	"runtime/debug"
	"testing"
)

const mib = 1 << 20

// restore puts the process's collector back as the test found it.
func restore(t *testing.T) {
	limit, percent := debug.SetMemoryLimit(-1), debug.SetGCPercent(100)
	debug.SetGCPercent(percent)
	t.Cleanup(func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(percent)
	})
}

// TestLimitFollowsTheBudget: the soft limit is 2 × processing.memory_budget
// + 32 MiB, 96 MiB at the default budget of 32 MiB, so a larger budget
// raises it instead of making the collector run without pause.
func TestLimitFollowsTheBudget(t *testing.T) {
	if got := Limit(32 * mib); got != 96*mib {
		t.Errorf("soft limit with a 32 MiB budget = %d MiB, want 96", got/mib)
	}
	if got := Limit(128 * mib); got != 288*mib {
		t.Errorf("soft limit with a 128 MiB budget = %d MiB, want 288", got/mib)
	}
}

// TestApplyRaisesTheGrowthUnderItsLimit: with neither variable set, Apply
// sets both the limit and the growth ratio.
func TestApplyRaisesTheGrowthUnderItsLimit(t *testing.T) {
	restore(t)
	debug.SetGCPercent(100)
	s := Apply([]string{"HOME=/"}, 32*mib)
	if s != (Settings{Limit: 96 * mib, Percent: Percent}) {
		t.Fatalf("Apply = %+v", s)
	}
	if got := debug.SetMemoryLimit(-1); got != 96*mib {
		t.Errorf("soft limit %d, want %d", got, 96*mib)
	}
	if got := GOGC(); got != Percent {
		t.Errorf("GOGC %d, want %d", got, Percent)
	}
}

// TestApplyLeavesWhatTheEnvironmentSet: GOGC and GOMEMLIMIT are the
// operator's; Apply changes neither, and without a finite limit it leaves
// the growth ratio alone, for nothing would bound the heap.
func TestApplyLeavesWhatTheEnvironmentSet(t *testing.T) {
	restore(t)

	debug.SetGCPercent(150)
	debug.SetMemoryLimit(math.MaxInt64)
	if s := Apply([]string{"GOGC=150"}, 32*mib); s != (Settings{Limit: 96 * mib}) {
		t.Errorf("with GOGC set: Apply = %+v, want the limit only", s)
	}
	if got := GOGC(); got != 150 {
		t.Errorf("with GOGC set: GOGC %d, want 150 kept", got)
	}

	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64) // as GOMEMLIMIT=off leaves it
	if s := Apply([]string{"GOMEMLIMIT=off"}, 32*mib); s != (Settings{}) {
		t.Errorf("with GOMEMLIMIT=off: Apply = %+v, want nothing set", s)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("with GOMEMLIMIT=off: soft limit %d, want none", got)
	}
	if got := GOGC(); got != 100 {
		t.Errorf("with GOMEMLIMIT=off: GOGC %d, want 100 kept", got)
	}

	debug.SetMemoryLimit(256 * mib) // as GOMEMLIMIT=256MiB leaves it
	if s := Apply([]string{"GOMEMLIMIT=256MiB"}, 32*mib); s != (Settings{Percent: Percent}) {
		t.Errorf("with GOMEMLIMIT=256MiB: Apply = %+v, want the growth ratio only", s)
	}
	if got := debug.SetMemoryLimit(-1); got != 256*mib {
		t.Errorf("with GOMEMLIMIT=256MiB: soft limit %d, want it kept", got)
	}
}
