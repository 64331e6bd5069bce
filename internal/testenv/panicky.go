package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildPanicky builds test/chaos/panicky — ratchet whose dashboard panics
// on the records RATCHET_CHAOS_PANIC_EVERY and RATCHET_CHAOS_PANIC_ALWAYS
// choose (internal/chaos.PanicChoice) — into dir (tb.TempDir() when dir is
// empty) and returns the binary's path.
func BuildPanicky(tb testing.TB, dir string) string {
	tb.Helper()
	if dir == "" {
		dir = tb.TempDir()
	}
	bin := filepath.Join(dir, "ratchet-panicky")
	cmd := exec.Command("go", "build", "-o", bin, "ratchet/test/chaos/panicky")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("build panicky ratchet: %v", err)
	}
	return bin
}
