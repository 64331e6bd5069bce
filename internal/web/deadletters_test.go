package web

import (
	"context"
	"encoding/json"
	"log/slog"
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

// The panel has a line per topic, pipeline, reason class and SQLSTATE,
// and its example reason reaches the page and /api/state without the
// record values it quotes (the page needs no login), unless
// log.include_values.
func TestDeadLettersPanelGroupsAndKeepsValuesOut(t *testing.T) {
	src := &deadSource{fakeSource: newFake(), dead: []DeadLetterSummary{
		{Topic: "orders", Class: "refused_by_postgres", Pipeline: "orders", SQLState: "22P02", Count: 684,
			Reason: `pipeline orders: upsert 1 rows of orders: ERROR: invalid input syntax for type numeric: "jane@example.com" (SQLSTATE 22P02)`},
		{Topic: "orders", Class: "expression", Pipeline: "revenue", Count: 3,
			Reason: `pipelines: pipeline revenue: rollup.time: the int 4111111111111111 is not a timestamp`},
	}}
	for _, tt := range []struct {
		name          string
		includeValues bool
	}{{"default", false}, {"opted in", true}} {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Options{Source: src, Logger: slog.New(slog.DiscardHandler), IncludeValues: tt.includeValues})
			h := s.Handler()
			body := do(t, h, http.MethodGet, "/api/state").body
			page := do(t, h, http.MethodGet, "/").body
			for _, where := range []struct{ name, text string }{{"/api/state", body}, {"/", page}} {
				leaked := strings.Contains(where.text, "jane@example.com") || strings.Contains(where.text, "4111111111111111")
				if leaked != tt.includeValues {
					t.Errorf("%s: record values shown = %v, want %v", where.name, leaked, tt.includeValues)
				}
			}
			for _, want := range []string{`"class":"refused_by_postgres"`, `"pipeline":"orders"`, `"sqlstate":"22P02"`} {
				if !strings.Contains(body, want) {
					t.Errorf("/api/state lacks %s: %s", want, body)
				}
			}
			for _, want := range []string{"<td>refused_by_postgres 22P02</td>", "<td>revenue</td>", "<td>expression</td>", "684"} {
				if !strings.Contains(page, want) {
					t.Errorf("page lacks %q", want)
				}
			}
		})
	}
}
