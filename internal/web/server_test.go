package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeSource is a Source with fixed answers, safe for concurrent use.
type fakeSource struct {
	mu        sync.Mutex
	pipeline  Pipeline
	rollups   []Rollup
	readiness Readiness
	err       error
	since     time.Time // last since passed to Rollups
}

func (f *fakeSource) Pipeline(context.Context) (Pipeline, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return Pipeline{}, f.err
	}
	return f.pipeline, nil
}

func (f *fakeSource) Rollups(_ context.Context, since time.Time) ([]Rollup, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.since = since
	if f.err != nil {
		return nil, f.err
	}
	var out []Rollup
	for _, r := range f.rollups {
		if !r.Bucket.Before(since) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *fakeSource) Readiness() Readiness {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readiness
}

var testNow = time.Date(2026, 3, 14, 12, 34, 56, 0, time.UTC)

func newFake() *fakeSource {
	minute := testNow.Truncate(time.Minute)
	return &fakeSource{
		pipeline: Pipeline{
			Instance: "ratchet-1",
			Group:    "ratchet-dashboard",
			Mode:     "exactly-once",
			Partitions: []PartitionStatus{
				{Topic: "events", Partition: 1, Owner: "ratchet-1", Assigned: true, StoredOffset: 1234567, CommittedOffset: 1234560, EndOffset: 1240000, Lag: 5433, Records: 9876543, Retries: 2, RatePerSec: 1523.25},
				{Topic: "events", Partition: 0, Owner: "ratchet-1", Assigned: true, StoredOffset: -1, CommittedOffset: -1, EndOffset: -1, Lag: -1, Paused: true},
			},
		},
		rollups: []Rollup{
			{Metric: "page_view", Bucket: minute, Count: 1200, Sum: 2400, Min: 1, Max: 3},
			{Metric: "page_view", Bucket: minute.Add(-time.Minute), Count: 800, Sum: 800, Min: 1, Max: 1},
			{Metric: "checkout", Bucket: minute.Add(-5 * time.Minute), Count: 7, Sum: 70, Min: 5, Max: 15},
			{Metric: "old", Bucket: minute.Add(-2 * time.Hour), Count: 1, Sum: 1, Min: 1, Max: 1},
		},
		readiness: Readiness{State: StateReady},
	}
}

func newTestServer(tb testing.TB, src Source) *Server {
	tb.Helper()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "ratchet_test_total", Help: "test counter"})
	reg.MustRegister(c)
	c.Add(3)
	s := New(Options{
		Addr:     "127.0.0.1:0",
		Source:   src,
		Gatherer: reg,
		Logger:   slog.New(slog.DiscardHandler),
		Title:    "ratchet test",
	})
	s.now = func() time.Time { return testNow }
	return s
}

type response struct {
	code   int
	header http.Header
	body   string
}

func do(tb testing.TB, h http.Handler, method, target string) response {
	tb.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return response{code: rec.Code, header: rec.Result().Header, body: rec.Body.String()}
}

func TestEndpoints(t *testing.T) {
	h := newTestServer(t, newFake()).Handler()
	tests := []struct {
		name        string
		target      string
		code        int
		contentType string
		contains    string
	}{
		{"healthz", "/healthz", 200, "text/plain; charset=utf-8", "ok"},
		{"readyz", "/readyz", 200, "application/json", `"state":"ready"`},
		{"metrics", "/metrics", 200, "text/plain", "ratchet_test_total 3"},
		{"state", "/api/state", 200, "application/json", `"instance":"ratchet-1"`},
		{"index", "/", 200, "text/html; charset=utf-8", "ratchet-dashboard"},
		{"script", "/static/app.js", 200, "text/javascript; charset=utf-8", "/api/state"},
		{"stylesheet", "/static/style.css", 200, "text/css; charset=utf-8", ".topbar"},
		{"unknown page", "/nope", 404, "text/plain; charset=utf-8", ""},
		{"unknown asset", "/static/nope.js", 404, "text/plain; charset=utf-8", ""},
		{"no static listing", "/static/", 404, "text/plain; charset=utf-8", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, h, http.MethodGet, tt.target)
			if r.code != tt.code {
				t.Fatalf("status = %d, want %d; body %q", r.code, tt.code, r.body)
			}
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, tt.contentType) {
				t.Errorf("Content-Type = %q, want prefix %q", ct, tt.contentType)
			}
			if !strings.Contains(r.body, tt.contains) {
				t.Errorf("body does not contain %q:\n%s", tt.contains, r.body)
			}
			if got := r.header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options = %q", got)
			}
			csp := r.header.Get("Content-Security-Policy")
			if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
				t.Errorf("Content-Security-Policy = %q", csp)
			}
		})
	}
}

func TestHealthzBody(t *testing.T) {
	r := do(t, newTestServer(t, newFake()).Handler(), http.MethodGet, "/healthz")
	if r.body != "ok" {
		t.Errorf("body = %q, want %q", r.body, "ok")
	}
}

func TestReadyz(t *testing.T) {
	tests := []struct {
		state ReadinessState
		code  int
	}{
		{StateReady, 200},
		{StateIdle, 200},
		{StateStarting, 503},
		{StateDegraded, 503},
		{StateDraining, 503},
		{"", 503},
	}
	for _, tt := range tests {
		t.Run(string(tt.state), func(t *testing.T) {
			src := newFake()
			src.readiness = Readiness{State: tt.state, Reason: "because " + string(tt.state)}
			r := do(t, newTestServer(t, src).Handler(), http.MethodGet, "/readyz")
			if r.code != tt.code {
				t.Fatalf("status = %d, want %d", r.code, tt.code)
			}
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type = %q", ct)
			}
			var got map[string]string
			if err := json.Unmarshal([]byte(r.body), &got); err != nil {
				t.Fatalf("decode %q: %v", r.body, err)
			}
			want := map[string]string{"state": string(tt.state), "reason": "because " + string(tt.state)}
			if len(got) != 2 || got["state"] != want["state"] || got["reason"] != want["reason"] {
				t.Errorf("body = %v, want %v", got, want)
			}
		})
	}
}

func TestReadyzWithoutSource(t *testing.T) {
	r := do(t, newTestServer(t, nil).Handler(), http.MethodGet, "/readyz")
	if r.code != http.StatusServiceUnavailable {
		t.Errorf("status = %d, want 503", r.code)
	}
}

func TestMethods(t *testing.T) {
	h := newTestServer(t, newFake()).Handler()
	for _, target := range []string{"/", "/healthz", "/readyz", "/metrics", "/api/state", "/static/app.js", "/nope"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
			t.Run(method+" "+target, func(t *testing.T) {
				r := do(t, h, method, target)
				if r.code != http.StatusMethodNotAllowed {
					t.Errorf("status = %d, want 405", r.code)
				}
				if got := r.header.Get("Allow"); got != "GET, HEAD" {
					t.Errorf("Allow = %q", got)
				}
			})
		}
		t.Run("HEAD "+target, func(t *testing.T) {
			r := do(t, h, http.MethodHead, target)
			if r.code == http.StatusMethodNotAllowed {
				t.Errorf("HEAD answered 405")
			}
		})
	}
}

func TestStateJSON(t *testing.T) {
	src := newFake()
	r := do(t, newTestServer(t, src).Handler(), http.MethodGet, "/api/state")
	if r.code != 200 {
		t.Fatalf("status = %d: %s", r.code, r.body)
	}

	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.body), &raw); err != nil {
		t.Fatalf("decode: %v", err)
	}
	for _, k := range []string{"pipeline", "rollups", "readiness", "generated_at"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("missing key %q in %s", k, r.body)
		}
	}

	var got struct {
		Pipeline struct {
			Instance   string           `json:"instance"`
			Group      string           `json:"group"`
			Mode       string           `json:"mode"`
			Partitions []map[string]any `json:"partitions"`
		} `json:"pipeline"`
		Rollups []struct {
			Metric string    `json:"metric"`
			Bucket time.Time `json:"bucket"`
			Count  int64     `json:"count"`
			Sum    float64   `json:"sum"`
			Min    float64   `json:"min"`
			Max    float64   `json:"max"`
		} `json:"rollups"`
		Readiness struct {
			State  string `json:"state"`
			Reason string `json:"reason"`
		} `json:"readiness"`
		GeneratedAt time.Time `json:"generated_at"`
	}
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if got.Pipeline.Instance != "ratchet-1" || got.Pipeline.Group != "ratchet-dashboard" || got.Pipeline.Mode != "exactly-once" {
		t.Errorf("pipeline header = %+v", got.Pipeline)
	}
	if len(got.Pipeline.Partitions) != 2 {
		t.Fatalf("partitions = %d, want 2", len(got.Pipeline.Partitions))
	}
	p0 := got.Pipeline.Partitions[0]
	wantKeys := []string{"topic", "partition", "owner", "assigned", "stored_offset", "committed_offset",
		"end_offset", "lag", "records", "retries", "dead_letters", "restarts", "rate_per_sec", "paused"}
	for _, k := range wantKeys {
		if _, ok := p0[k]; !ok {
			t.Errorf("partition lacks %q: %v", k, p0)
		}
	}
	if p0["partition"] != float64(0) || got.Pipeline.Partitions[1]["partition"] != float64(1) {
		t.Errorf("partitions not sorted: %v", got.Pipeline.Partitions)
	}
	if p0["stored_offset"] != float64(-1) || p0["paused"] != true {
		t.Errorf("partition 0 = %v", p0)
	}

	wantSince := time.Date(2026, 3, 14, 12, 5, 0, 0, time.UTC)
	if !src.since.Equal(wantSince) {
		t.Errorf("Rollups since = %v, want %v", src.since, wantSince)
	}
	if len(got.Rollups) != 3 {
		t.Fatalf("rollups = %+v, want 3 in the window", got.Rollups)
	}
	if got.Rollups[0].Metric != "checkout" || got.Rollups[1].Metric != "page_view" || got.Rollups[2].Count != 1200 {
		t.Errorf("rollups not sorted by metric and bucket: %+v", got.Rollups)
	}
	if got.Readiness.State != "ready" {
		t.Errorf("readiness = %+v", got.Readiness)
	}
	if !got.GeneratedAt.Equal(testNow) {
		t.Errorf("generated_at = %v, want %v", got.GeneratedAt, testNow)
	}
}

func TestStateEmptyListsAreArrays(t *testing.T) {
	src := &fakeSource{readiness: Readiness{State: StateIdle}}
	r := do(t, newTestServer(t, src).Handler(), http.MethodGet, "/api/state")
	if !strings.Contains(r.body, `"partitions":[]`) || !strings.Contains(r.body, `"rollups":[]`) {
		t.Errorf("empty lists should encode as []: %s", r.body)
	}
}

func TestStateNonFiniteFloats(t *testing.T) {
	src := newFake()
	src.pipeline.Partitions[0].RatePerSec = posInf()
	src.rollups[0].Min = nan()
	r := do(t, newTestServer(t, src).Handler(), http.MethodGet, "/api/state")
	if r.code != 200 {
		t.Fatalf("status = %d: %s", r.code, r.body)
	}
	if !strings.Contains(r.body, `"min":null`) || !strings.Contains(r.body, `"rate_per_sec":null`) {
		t.Errorf("non-finite floats should encode as null: %s", r.body)
	}
}

func TestSourceError(t *testing.T) {
	const secret = "postgres://admin:hunter2@db.internal:5432/ratchet"
	src := newFake()
	src.err = errors.New("connect " + secret + ": connection refused")
	h := newTestServer(t, src).Handler()

	t.Run("api", func(t *testing.T) {
		r := do(t, h, http.MethodGet, "/api/state")
		if r.code != http.StatusInternalServerError {
			t.Fatalf("status = %d, want 500", r.code)
		}
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("Content-Type = %q", ct)
		}
		if strings.Contains(r.body, "hunter2") || strings.Contains(r.body, "db.internal") {
			t.Errorf("body leaks the error: %s", r.body)
		}
		var got map[string]string
		if err := json.Unmarshal([]byte(r.body), &got); err != nil || got["error"] != "source unavailable" {
			t.Errorf("body = %q (%v), want error source unavailable", r.body, err)
		}
	})
	t.Run("page", func(t *testing.T) {
		r := do(t, h, http.MethodGet, "/")
		if r.code != http.StatusOK {
			t.Fatalf("status = %d, want 200", r.code)
		}
		if strings.Contains(r.body, "hunter2") || strings.Contains(r.body, "db.internal") {
			t.Errorf("page leaks the error")
		}
		if !strings.Contains(r.body, "source unavailable") {
			t.Errorf("page does not say the source is unavailable")
		}
	})
}

func TestPageEscapes(t *testing.T) {
	src := newFake()
	evil := `<script>alert("x")</script>`
	src.rollups = append(src.rollups, Rollup{Metric: evil, Bucket: testNow.Truncate(time.Minute), Count: 1})
	src.pipeline.Instance = `<img src=x onerror=alert(1)>`
	src.pipeline.Partitions[0].Topic = `</td><script>`
	src.readiness = Readiness{State: StateDegraded, Reason: `"><script>bad()</script>`}
	r := do(t, newTestServer(t, src).Handler(), http.MethodGet, "/")
	if r.code != 200 {
		t.Fatalf("status = %d", r.code)
	}
	for _, raw := range []string{evil, "<img src=x", "</td><script>", `"><script>`} {
		if strings.Contains(r.body, raw) {
			t.Errorf("page contains unescaped %q", raw)
		}
	}
	if !strings.Contains(r.body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
		t.Errorf("escaped metric name missing from page")
	}
	// The only script element is the external one.
	if n := strings.Count(r.body, "<script"); n != 1 {
		t.Errorf("page has %d script tags, want 1", n)
	}
}

func TestPageContent(t *testing.T) {
	r := do(t, newTestServer(t, newFake()).Handler(), http.MethodGet, "/")
	for _, want := range []string{
		"ratchet test",            // title
		"exactly-once",            // mode
		"state-ready",             // readiness badge
		"1,234,567",               // stored offset with separators
		"9,876,543",               // records
		"1,523.3",                 // rate
		"5,433",                   // lag
		"paused",                  // paused badge
		`data-metric="page_view"`, // chart card
		"2,000",                   // page_view total in the window
		"<rect",                   // bars
		`src="/static/app.js?v=`,
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(r.body, `data-metric="old"`) {
		t.Errorf("page shows a metric outside the window")
	}
}

func TestStaticETag(t *testing.T) {
	h := newTestServer(t, newFake()).Handler()
	r := do(t, h, http.MethodGet, "/static/app.js")
	etag := r.header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag")
	}
	req := httptest.NewRequest(http.MethodGet, "/static/app.js", nil)
	req.Header.Set("If-None-Match", etag)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified {
		t.Errorf("revalidation status = %d, want 304", rec.Code)
	}
}

func TestRun(t *testing.T) {
	s := newTestServer(t, newFake())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(addr string) { addrs <- addr }) }()

	var addr string
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("ready was not called")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("ready addr = %q (%v)", addr, err)
	}
	res, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("get healthz: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(body) != "ok" {
		t.Errorf("healthz = %d %q", res.StatusCode, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Error("server still answers after Run returned")
	}
}

func TestRunPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := New(Options{Addr: ln.Addr().String(), Source: newFake(), Logger: slog.New(slog.DiscardHandler)})
	called := false
	err = s.Run(t.Context(), func(string) { called = true })
	if err == nil {
		t.Fatal("Run on a used port returned nil")
	}
	if !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Errorf("error %q does not name the address", err)
	}
	if called {
		t.Error("ready called although listen failed")
	}
}

func TestFormat(t *testing.T) {
	ints := []struct {
		in   int64
		want string
	}{
		{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567, "1,234,567"}, {-1234, "-1,234"},
		{-9223372036854775808, "-9,223,372,036,854,775,808"},
	}
	for _, tt := range ints {
		t.Run(tt.want, func(t *testing.T) {
			if got := formatInt(tt.in); got != tt.want {
				t.Errorf("formatInt(%d) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	floats := []struct {
		in   float64
		dec  int
		want string
	}{
		{1523.25, 1, "1,523.3"}, {0, 2, "0.00"}, {1234567.891, 2, "1,234,567.89"},
		{-0.001, 1, "0.0"}, {-2500.5, 1, "-2,500.5"}, {nan(), 1, "—"}, {posInf(), 1, "—"},
	}
	for _, tt := range floats {
		t.Run(tt.want, func(t *testing.T) {
			if got := formatFloat(tt.in, tt.dec); got != tt.want {
				t.Errorf("formatFloat(%v, %d) = %q, want %q", tt.in, tt.dec, got, tt.want)
			}
		})
	}
}

func nan() float64    { return math.NaN() }
func posInf() float64 { return math.Inf(1) }
