package testenv

import "testing"

// BuildPanicky builds test/chaos/panicky — ratchet whose dashboard panics
// on the records RATCHET_CHAOS_PANIC_EVERY and RATCHET_CHAOS_PANIC_ALWAYS
// choose (internal/chaos.PanicChoice) — into dir (tb.TempDir() when dir is
// empty) and returns the binary's path.
func BuildPanicky(tb testing.TB, dir string) string {
	tb.Helper()
	return build(tb, dir, "ratchet-panicky", "ratchet/test/chaos/panicky")
}
