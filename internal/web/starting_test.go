package web

import (
	"net/http"
	"strings"
	"testing"
)

// TestStartingProbes: while the engine waits for its dependencies the
// process is alive (/healthz 200) but not ready (/readyz 503 with the
// reason), and the page renders with no partitions; once the real source
// is served, everything goes to it.
func TestStartingProbes(t *testing.T) {
	st := NewStarting(Pipeline{Instance: "pod-0", Group: "g", Mode: "exactly-once",
		Partitions: []PartitionStatus{{Topic: "ignored"}}}, "connecting")
	h := newTestServer(t, st).Handler()

	if r := do(t, h, http.MethodGet, "/healthz"); r.code != 200 {
		t.Errorf("healthz while starting = %d %q, want 200", r.code, r.body)
	}
	st.Wait("waiting for PostgreSQL (attempt 3): connection refused")
	r := do(t, h, http.MethodGet, "/readyz")
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, `"state":"starting"`) ||
		!strings.Contains(r.body, "waiting for PostgreSQL (attempt 3): connection refused") {
		t.Errorf("readyz while starting = %d %s, want 503 starting with the reason", r.code, r.body)
	}
	for _, target := range []string{"/", "/api/state"} {
		r := do(t, h, http.MethodGet, target)
		if r.code != 200 || !strings.Contains(r.body, "pod-0") || strings.Contains(r.body, "ignored") {
			t.Errorf("%s while starting = %d %s, want 200 naming the instance and no partitions", target, r.code, r.body)
		}
	}

	st.Serve(newFake())
	if r := do(t, h, http.MethodGet, "/readyz"); r.code != 200 || !strings.Contains(r.body, `"state":"ready"`) {
		t.Errorf("readyz after Serve = %d %s, want 200 ready", r.code, r.body)
	}
	if r := do(t, h, http.MethodGet, "/api/state"); r.code != 200 || !strings.Contains(r.body, "ratchet-1") {
		t.Errorf("api/state after Serve = %d %s, want the served source's pipeline", r.code, r.body)
	}
}
