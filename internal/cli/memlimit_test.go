package cli

import (
	"testing"

	"ratchet/config"
)

// TestMemoryLimitFollowsTheBudget: without GOMEMLIMIT the soft limit is
// 2 × processing.memory_budget + 64 MiB, 128 MiB at the default budget, so
// a larger budget raises it instead of making the collector run without
// pause.
func TestMemoryLimitFollowsTheBudget(t *testing.T) {
	const mib = 1 << 20
	if got := memoryLimit(int64(config.Default().Processing.MemoryBudget)); got != 128*mib {
		t.Errorf("soft limit at the default budget = %d MiB, want 128", got/mib)
	}
	if got := memoryLimit(128 * mib); got != 320*mib {
		t.Errorf("soft limit with a 128 MiB budget = %d MiB, want 320", got/mib)
	}
}
