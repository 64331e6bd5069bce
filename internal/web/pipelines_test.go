package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// pipelineSource is a fakeSource that also runs configured pipelines.
type pipelineSource struct {
	*fakeSource
	pls []PipelineSummary
}

func (p *pipelineSource) Pipelines(context.Context) ([]PipelineSummary, error) { return p.pls, nil }

func TestPipelinesPanel(t *testing.T) {
	src := &pipelineSource{fakeSource: newFake(), pls: []PipelineSummary{
		{Name: "orders", Topic: "orders", Sink: "upsert", Table: "orders", Written: 12345, Filtered: 7, Ignored: 0, DeadLettered: 3, Upserted: 9000, Deleted: 4},
		{Name: "revenue_per_minute", Topic: "orders", Sink: "rollup", Table: "revenue_per_minute", Written: 12350, Merged: 420},
		{Name: "order_events", Topic: "orders", Sink: "append", Table: "order_events", Written: 12340, Appended: 12340},
	}}
	h := newTestServer(t, src).Handler()

	r := do(t, h, http.MethodGet, "/api/state")
	var got struct {
		Pipelines []struct {
			Name         string `json:"name"`
			Sink         string `json:"sink"`
			Written      int64  `json:"written"`
			DeadLettered int64  `json:"dead_lettered"`
			Merged       int64  `json:"merged"`
			Appended     int64  `json:"appended"`
		} `json:"pipelines"`
	}
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Pipelines) != 3 || got.Pipelines[2].Sink != "append" || got.Pipelines[2].Appended != 12340 || got.Pipelines[0].Name != "orders" || got.Pipelines[0].Written != 12345 ||
		got.Pipelines[0].DeadLettered != 3 || got.Pipelines[1].Sink != "rollup" || got.Pipelines[1].Merged != 420 {
		t.Errorf("pipelines = %+v", got.Pipelines)
	}
	page := do(t, h, http.MethodGet, "/").body
	for _, want := range []string{`<section id="pipelines-card" class="card">`, "revenue_per_minute", "12,345",
		"9,000 upserted, 4 deleted", "420 merged", "12,340 appended", `<td class="num bad">3</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestNoPipelinesPanelWithoutPipelines(t *testing.T) {
	h := newTestServer(t, newFake()).Handler()
	if page := do(t, h, http.MethodGet, "/").body; !strings.Contains(page, `<section id="pipelines-card" class="card" hidden>`) {
		t.Error("the pipelines panel is shown without pipelines")
	}
	if body := do(t, h, http.MethodGet, "/api/state").body; !strings.Contains(body, `"pipelines":null`) {
		t.Errorf("pipelines is not null: %s", body)
	}
}

// The engine's server reads its source through Starting: the panel must
// come through once the source is served, and not before.
func TestStartingForwardsPipelines(t *testing.T) {
	st := NewStarting(Pipeline{Instance: "pod-0"}, "connecting")
	h := newTestServer(t, st).Handler()
	if body := do(t, h, http.MethodGet, "/api/state").body; !strings.Contains(body, `"pipelines":null`) {
		t.Errorf("while starting, pipelines is not null: %s", body)
	}
	st.Serve(&pipelineSource{fakeSource: newFake(), pls: []PipelineSummary{{Name: "orders", Sink: "upsert", Written: 5}}})
	if body := do(t, h, http.MethodGet, "/api/state").body; !strings.Contains(body, `"name":"orders"`) {
		t.Errorf("after Serve, the pipelines are not shown: %s", body)
	}
}

// With pipelines replacing the built-in processor the Dashboard panel,
// which charts dashboard_rollups, is hidden, unless a pipeline writes that
// table (the dashboard as a pipeline). The pipelines panel says its
// written counts include retries and has no stray "pipelines:" in its
// subtitle.
func TestDashboardPanelWithPipelines(t *testing.T) {
	for _, tt := range []struct {
		name string
		pls  []PipelineSummary
		want bool
	}{
		{"no pipelines", nil, true},
		{"pipelines into other tables", []PipelineSummary{{Name: "orders", Sink: "upsert", Table: "orders"}}, false},
		{"the dashboard as a pipeline", []PipelineSummary{{Name: "dashboard", Sink: "rollup", Table: "public.dashboard_rollups"}}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var src Source = newFake()
			if tt.pls != nil {
				src = &pipelineSource{fakeSource: newFake(), pls: tt.pls}
			}
			h := newTestServer(t, src).Handler()
			page := do(t, h, http.MethodGet, "/").body
			if shown := strings.Contains(page, `<section id="dashboard" class="dashboard">`); shown != tt.want {
				t.Errorf("dashboard panel shown = %v, want %v", shown, tt.want)
			}
			if body := do(t, h, http.MethodGet, "/api/state").body; !strings.Contains(body, fmt.Sprintf(`"dashboard":%v`, tt.want)) {
				t.Errorf("/api/state dashboard is not %v: %s", tt.want, body)
			}
			if tt.pls != nil && (!strings.Contains(page, "Written (incl. retries)") || strings.Contains(page, "<code>pipelines:</code> ·")) {
				t.Errorf("pipelines panel head: %s", page)
			}
		})
	}
}
