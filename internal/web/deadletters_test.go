package web

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// deadSource is a fakeSource that also reports dead-letter reasons.
type deadSource struct {
	*fakeSource
	dead []DeadLetterSummary
}

func (d *deadSource) DeadLetters(context.Context) ([]DeadLetterSummary, error) { return d.dead, nil }

func TestDeadLettersPanel(t *testing.T) {
	last := time.Date(2026, 12, 3, 10, 4, 5, 0, time.UTC)
	src := &deadSource{fakeSource: newFake(), dead: []DeadLetterSummary{
		{Topic: "events", Reason: `ledger: check "val_not_negative" <violated>`, Count: 1234, Last: last},
		{Topic: "other", Count: 2},
	}}
	h := newTestServer(t, src).Handler()

	r := do(t, h, http.MethodGet, "/api/state")
	var got struct {
		DeadLetters []struct {
			Topic  string     `json:"topic"`
			Reason string     `json:"reason"`
			Count  int64      `json:"count"`
			Last   *time.Time `json:"last_failed_at"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.DeadLetters) != 2 || got.DeadLetters[0].Count != 1234 || got.DeadLetters[0].Last == nil ||
		!got.DeadLetters[0].Last.Equal(last) || got.DeadLetters[1].Last != nil || got.DeadLetters[1].Reason != "" {
		t.Errorf("dead_letters = %+v", got.DeadLetters)
	}

	page := do(t, h, http.MethodGet, "/").body
	for _, want := range []string{`<section id="dead-letters-card" class="card">`, "1,234", "2026-12-03T10:04:05Z",
		"&lt;violated&gt;", "reasons: ratchet dlq ls"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}

	// No reasons yet: the panel says so.
	src.dead = nil
	if page := do(t, h, http.MethodGet, "/").body; !strings.Contains(page, "No dead letters.") {
		t.Error("empty panel does not say there are no dead letters")
	}
	if body := do(t, h, http.MethodGet, "/api/state").body; !strings.Contains(body, `"dead_letters":[]`) {
		t.Errorf("empty dead letters are not an empty list: %s", body)
	}
}

func TestNoDeadLettersPanelWithoutASource(t *testing.T) {
	h := newTestServer(t, newFake()).Handler()
	if page := do(t, h, http.MethodGet, "/").body; !strings.Contains(page, `<section id="dead-letters-card" class="card" hidden>`) {
		t.Error("the dead-letters panel is shown for a source without reasons")
	}
	if body := do(t, h, http.MethodGet, "/api/state").body; !strings.Contains(body, `"dead_letters":null`) {
		t.Errorf("dead_letters is not null: %s", body)
	}
}
