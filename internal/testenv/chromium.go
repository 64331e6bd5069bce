package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// chromiumNames are the executables Chromium ships as on Debian and Ubuntu.
var chromiumNames = []string{"/usr/bin/chromium", "/usr/bin/chromium-browser", "chromium", "chromium-browser"}

// Chromium returns the path of a Chromium executable for browser tests
// (RATCHET_TEST_CHROMIUM when set). Without one the test is skipped, except
// when CI=true, where a missing browser is a failure.
func Chromium(tb testing.TB) string {
	tb.Helper()
	names := chromiumNames
	if p := os.Getenv("RATCHET_TEST_CHROMIUM"); p != "" {
		names = []string{p}
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("Chromium is required when CI=true: none of %v found", names)
	}
	tb.Skipf("Chromium not found (tried %v); install Debian's chromium or set RATCHET_TEST_CHROMIUM", names)
	return ""
}
