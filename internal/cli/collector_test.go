package cli

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"

	"ratchet/config"
	"ratchet/internal/gcpolicy"
)

// `ratchet run` sets the collector from processing.memory_budget unless
// the operator set GOGC or GOMEMLIMIT.
func TestRunSetsTheCollectorFromTheBudget(t *testing.T) {
	limit, percent := debug.SetMemoryLimit(-1), gcpolicy.GOGC()
	t.Cleanup(func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(percent)
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config.Default()
	cfg.Processing.MemoryBudget = 64 << 20

	debug.SetGCPercent(100)
	setCollector(&env{environ: []string{"HOME=/"}}, cfg, log)
	if got, want := debug.SetMemoryLimit(-1), gcpolicy.Limit(64<<20); got != want {
		t.Errorf("soft limit %d, want %d", got, want)
	}
	if got := gcpolicy.GOGC(); got != gcpolicy.Percent {
		t.Errorf("GOGC %d, want %d", got, gcpolicy.Percent)
	}

	debug.SetGCPercent(100)
	debug.SetMemoryLimit(300 << 20)
	setCollector(&env{environ: []string{"GOGC=100", "GOMEMLIMIT=300MiB"}}, cfg, log)
	if got := debug.SetMemoryLimit(-1); got != 300<<20 {
		t.Errorf("with GOMEMLIMIT set: soft limit %d, want it kept", got)
	}
	if got := gcpolicy.GOGC(); got != 100 {
		t.Errorf("with GOGC set: GOGC %d, want it kept", got)
	}
}
