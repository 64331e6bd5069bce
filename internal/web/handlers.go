package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"ratchet/internal/redact"
)

// errNoSource is returned by snapshot when the server was built without one.
var errNoSource = errors.New("no source configured")

// state is one consistent read of the Source, as /api/state and / show it.
type state struct {
	Pipeline    Pipeline
	Rollups     []Rollup
	DeadLetters []DeadLetterSummary // nil without a DeadLetterSource
	Pipelines   []PipelineSummary   // nil without a PipelineSource
	// Dashboard says whether the page charts dashboard_rollups: not when
	// configured pipelines replace the built-in processor and none of them
	// writes that table (the panel would stay empty).
	Dashboard   bool
	Readiness   Readiness
	GeneratedAt time.Time
	Since       time.Time // first bucket of the window
}

// snapshot reads the Source. Partitions come back sorted by topic and
// partition, rollups by metric and bucket.
func (s *Server) snapshot(ctx context.Context) (state, error) {
	if s.source == nil {
		return state{}, errNoSource
	}
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()

	now := s.now().UTC()
	since := now.Truncate(time.Minute).Add(-(windowMinutes - 1) * time.Minute)
	p, err := s.source.Pipeline(ctx)
	if err != nil {
		return state{}, err
	}
	rs, err := s.source.Rollups(ctx, since)
	if err != nil {
		return state{}, err
	}
	var dead []DeadLetterSummary
	if ds, ok := s.source.(DeadLetterSource); ok {
		if dead, err = ds.DeadLetters(ctx); err != nil {
			return state{}, err
		}
		if dead == nil {
			dead = []DeadLetterSummary{}
		}
		dead = slices.Clone(dead)
		for i := range dead {
			if !s.includeValues {
				dead[i].Reason = redact.Values(dead[i].Reason)
			}
		}
	}
	var pls []PipelineSummary
	if ps, ok := s.source.(PipelineSource); ok {
		if pls, err = ps.Pipelines(ctx); err != nil {
			return state{}, err
		}
	}
	p.Partitions = slices.Clone(p.Partitions)
	slices.SortStableFunc(p.Partitions, func(a, b PartitionStatus) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	rs = slices.Clone(rs)
	slices.SortStableFunc(rs, func(a, b Rollup) int {
		if c := strings.Compare(a.Metric, b.Metric); c != 0 {
			return c
		}
		return a.Bucket.Compare(b.Bucket)
	})
	return state{
		Pipeline:    p,
		Rollups:     rs,
		DeadLetters: dead,
		Pipelines:   pls,
		Dashboard:   chartsDashboard(pls),
		Readiness:   s.source.Readiness(),
		GeneratedAt: now,
		Since:       since,
	}, nil
}

// dashboardTable is the built-in processor's table, which the Dashboard
// panel charts.
const dashboardTable = "dashboard_rollups"

// chartsDashboard reports whether the Dashboard panel has anything to
// chart: the built-in processor runs (no pipelines), or a pipeline writes
// its table (the dashboard as a pipeline).
func chartsDashboard(pls []PipelineSummary) bool {
	if pls == nil {
		return true
	}
	for _, p := range pls {
		if t := p.Table; t == dashboardTable || strings.HasSuffix(t, "."+dashboardTable) {
			return true
		}
	}
	return false
}

func (s *Server) readiness() Readiness {
	if s.source == nil {
		return Readiness{State: StateStarting, Reason: "no source configured"}
	}
	return s.source.Readiness()
}

// handleHealthz answers 200 while the process can serve at all.
func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok"))
}

// handleReadyz answers 200 when ready or idle and 503 otherwise, with the
// state and reason as JSON either way.
func (s *Server) handleReadyz(w http.ResponseWriter, _ *http.Request) {
	rd := s.readiness()
	code := http.StatusOK
	if !rd.State.Ready() {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, readinessJSON{State: string(rd.State), Reason: rd.Reason})
}

// handleState serves the JSON behind the page.
func (s *Server) handleState(w http.ResponseWriter, r *http.Request) {
	st, err := s.snapshot(r.Context())
	if err != nil {
		s.sourceFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toStateJSON(st))
}

// sourceFailed logs err and answers 500 without its text: errors from the
// store may carry connection strings or hosts.
func (s *Server) sourceFailed(w http.ResponseWriter, r *http.Request, err error) {
	s.warnSource(r, err)
	writeJSON(w, http.StatusInternalServerError, errorJSON{Error: "source unavailable"})
}

// warnSource logs a Source failure at most once per sourceWarnEvery: every
// open page polls, and a store that is down would otherwise flood the log.
// Failures caused by the client going away are not logged.
func (s *Server) warnSource(r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastWarn.Load()
	if now-last < int64(sourceWarnEvery) || !s.lastWarn.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("state source failed", "path", r.URL.Path, "err", err)
}

// handleIndex renders the live page. When the Source fails the page is still
// served, with a notice, so the script can pick up once it recovers.
func (s *Server) handleIndex(w http.ResponseWriter, r *http.Request) {
	st, err := s.snapshot(r.Context())
	var v pageView
	if err != nil {
		s.warnSource(r, err)
		v = buildErrorView(s.title, s.readiness(), s.now().UTC())
	} else {
		v = buildView(s.title, st)
	}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, v); err != nil {
		s.log.Error("render page", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only reachable with a type that cannot be encoded; all floats go
		// through number, so this is a programming error.
		code, b = http.StatusInternalServerError, []byte(`{"error":"encoding failed"}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// The wire shape of /api/state and /readyz. It is separate from the Go types
// so that their field names can change without breaking the page, and so
// that non-finite floats encode as null instead of failing.

type stateJSON struct {
	Pipeline pipelineJSON `json:"pipeline"`
	Rollups  []rollupJSON `json:"rollups"`
	// DeadLetters is null when the source has no dead-letter reasons.
	DeadLetters []deadLetterJSON `json:"dead_letters"`
	// Pipelines is null when no pipelines are configured.
	Pipelines []pipelineSummaryJSON `json:"pipelines"`
	// Dashboard is false when the Dashboard panel has nothing to chart.
	Dashboard   bool          `json:"dashboard"`
	Readiness   readinessJSON `json:"readiness"`
	GeneratedAt time.Time     `json:"generated_at"`
	Since       time.Time     `json:"since"`
	Window      int           `json:"window_minutes"`
}

type pipelineSummaryJSON struct {
	Name         string `json:"name"`
	Topic        string `json:"topic"`
	Sink         string `json:"sink"`
	Table        string `json:"table"`
	Written      int64  `json:"written"`
	Filtered     int64  `json:"filtered"`
	Ignored      int64  `json:"ignored"`
	DeadLettered int64  `json:"dead_lettered"`
	Upserted     int64  `json:"upserted"`
	Deleted      int64  `json:"deleted"`
	Merged       int64  `json:"merged"`
	Appended     int64  `json:"appended"`
}

type pipelineJSON struct {
	Instance   string          `json:"instance"`
	Group      string          `json:"group"`
	Mode       string          `json:"mode"`
	Partitions []partitionJSON `json:"partitions"`
}

type partitionJSON struct {
	Topic           string `json:"topic"`
	Partition       int32  `json:"partition"`
	Owner           string `json:"owner"`
	Assigned        bool   `json:"assigned"`
	StoredOffset    int64  `json:"stored_offset"`
	CommittedOffset int64  `json:"committed_offset"`
	EndOffset       int64  `json:"end_offset"`
	Lag             int64  `json:"lag"`
	Records         int64  `json:"records"`
	Retries         int64  `json:"retries"`
	DeadLetters     int64  `json:"dead_letters"`
	Restarts        int64  `json:"restarts"`
	RatePerSec      number `json:"rate_per_sec"`
	Paused          bool   `json:"paused"`
}

type rollupJSON struct {
	Metric string    `json:"metric"`
	Bucket time.Time `json:"bucket"`
	Count  int64     `json:"count"`
	Sum    number    `json:"sum"`
	Min    number    `json:"min"`
	Max    number    `json:"max"`
}

type deadLetterJSON struct {
	Topic    string     `json:"topic"`
	Class    string     `json:"class"`
	Pipeline string     `json:"pipeline"`
	SQLState string     `json:"sqlstate"`
	Reason   string     `json:"reason"`
	Count    int64      `json:"count"`
	Last     *time.Time `json:"last_failed_at"` // null when unknown
}

type readinessJSON struct {
	State  string `json:"state"`
	Reason string `json:"reason"`
}

type errorJSON struct {
	Error string `json:"error"`
}

// number is a float64 that encodes NaN and ±Inf as null.
type number float64

// MarshalJSON implements json.Marshaler.
func (n number) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(f)
}

func toStateJSON(st state) stateJSON {
	out := stateJSON{
		Pipeline: pipelineJSON{
			Instance:   st.Pipeline.Instance,
			Group:      st.Pipeline.Group,
			Mode:       st.Pipeline.Mode,
			Partitions: make([]partitionJSON, 0, len(st.Pipeline.Partitions)),
		},
		Rollups:     make([]rollupJSON, 0, len(st.Rollups)),
		Dashboard:   st.Dashboard,
		Readiness:   readinessJSON{State: string(st.Readiness.State), Reason: st.Readiness.Reason},
		GeneratedAt: st.GeneratedAt,
		Since:       st.Since,
		Window:      windowMinutes,
	}
	for _, p := range st.Pipeline.Partitions {
		out.Pipeline.Partitions = append(out.Pipeline.Partitions, partitionJSON{
			Topic:           p.Topic,
			Partition:       p.Partition,
			Owner:           p.Owner,
			Assigned:        p.Assigned,
			StoredOffset:    p.StoredOffset,
			CommittedOffset: p.CommittedOffset,
			EndOffset:       p.EndOffset,
			Lag:             p.Lag,
			Records:         p.Records,
			Retries:         p.Retries,
			DeadLetters:     p.DeadLetters,
			Restarts:        p.Restarts,
			RatePerSec:      number(p.RatePerSec),
			Paused:          p.Paused,
		})
	}
	if st.DeadLetters != nil {
		out.DeadLetters = make([]deadLetterJSON, 0, len(st.DeadLetters))
	}
	for _, d := range st.DeadLetters {
		j := deadLetterJSON{Topic: d.Topic, Class: d.Class, Pipeline: d.Pipeline, SQLState: d.SQLState, Reason: d.Reason, Count: d.Count}
		if !d.Last.IsZero() {
			last := d.Last.UTC()
			j.Last = &last
		}
		out.DeadLetters = append(out.DeadLetters, j)
	}
	if st.Pipelines != nil {
		out.Pipelines = make([]pipelineSummaryJSON, 0, len(st.Pipelines))
	}
	for _, p := range st.Pipelines {
		out.Pipelines = append(out.Pipelines, pipelineSummaryJSON{Name: p.Name, Topic: p.Topic, Sink: p.Sink, Table: p.Table,
			Written: p.Written, Filtered: p.Filtered, Ignored: p.Ignored, DeadLettered: p.DeadLettered,
			Upserted: p.Upserted, Deleted: p.Deleted, Merged: p.Merged, Appended: p.Appended})
	}
	for _, r := range st.Rollups {
		out.Rollups = append(out.Rollups, rollupJSON{
			Metric: r.Metric,
			Bucket: r.Bucket.UTC(),
			Count:  r.Count,
			Sum:    number(r.Sum),
			Min:    number(r.Min),
			Max:    number(r.Max),
		})
	}
	return out
}
