package actors

import (
	"strings"
	"testing"
	"time"
)

func TestAssignmentTimeout(t *testing.T) {
	for _, c := range []struct {
		name           string
		session, drain time.Duration
		want           time.Duration
	}{
		{"defaults", 30 * time.Second, 30 * time.Second, 90 * time.Second},
		{"short session", 6 * time.Second, 3 * time.Second, 15 * time.Second},
		{"session unknown: no watchdog", 0, 30 * time.Second, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := AssignmentTimeout(c.session, c.drain); got != c.want {
				t.Errorf("AssignmentTimeout(%s, %s) = %s, want %s", c.session, c.drain, got, c.want)
			}
		})
	}
}

// TestWaitAttrsNameTheRemedy checks that the lines about a long wait say
// what the group waits for and what shortens it, for a dynamic and a
// static member.
func TestWaitAttrsNameTheRemedy(t *testing.T) {
	for _, c := range []struct {
		name     string
		instance string
		want     []string // in the remedy
	}{
		{"dynamic member", "", []string{"kafka.instance_id", "session.timeout.ms"}},
		{"static member", "pod-0", []string{"session.timeout.ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Supervisor{cfg: SupervisorConfig{GroupID: "g", InstanceID: c.instance,
				SessionTimeout: 30 * time.Second, AssignmentTimeout: 90 * time.Second}}
			s.waitFrom = "subscribe"
			attrs := map[string]any{}
			kv := s.waitAttrs(12 * time.Second)
			for i := 0; i+1 < len(kv); i += 2 {
				attrs[kv[i].(string)] = kv[i+1]
			}
			remedy, _ := attrs["remedy"].(string)
			for _, w := range c.want {
				if !strings.Contains(remedy, w) {
					t.Errorf("remedy %q does not name %s", remedy, w)
				}
			}
			if w, _ := attrs["waiting_for"].(string); !strings.Contains(w, "session expires") {
				t.Errorf("waiting_for %q does not say the group waits for a session to expire", w)
			}
			if attrs["rebuild_after"] != "1m30s" || attrs["since"] != "subscribe" || attrs["waited"] != "12s" {
				t.Errorf("attrs %v", attrs)
			}
		})
	}
}
