// Package web serves ratchet's HTTP side: Prometheus /metrics, the /healthz
// and /readyz probes, and a live page at / with the pipeline per partition
// and the dashboard rollups as charts, fed by the JSON at /api/state.
//
// The page is rendered on the server with html/template and then kept up to
// date by a small script that polls /api/state and re-renders in place. All
// assets are embedded in the binary and served under /static/: the page
// works without network access and under a Content-Security-Policy that
// allows only 'self' (no inline scripts or styles).
package web

import (
	"context"
	"time"
)

// Source is what the page and the probes read. Implementations must be safe
// for concurrent use: every request calls it from its own goroutine.
// Pipeline and Rollups should honour ctx, which is cancelled when the client
// goes away or the request's deadline passes.
type Source interface {
	// Pipeline returns the state of every partition this instance knows of.
	Pipeline(ctx context.Context) (Pipeline, error)
	// Rollups returns dashboard rows with bucket >= since.
	Rollups(ctx context.Context, since time.Time) ([]Rollup, error)
	// Readiness reports whether the instance is ready and why not. It is
	// called by /readyz and must not block.
	Readiness() Readiness
}

// DeadLetterSource is implemented by a Source that can say why records were
// dead-lettered; the page then shows a dead-letters panel. Like the other
// Source methods it must be safe for concurrent use and honour ctx.
type DeadLetterSource interface {
	// DeadLetters returns the most recent reasons, latest first.
	DeadLetters(ctx context.Context) ([]DeadLetterSummary, error)
}

// PipelineSource is implemented by a Source that runs configured
// pipelines; the page then shows a pipelines panel. Like the other Source
// methods it must be safe for concurrent use and honour ctx.
type PipelineSource interface {
	// Pipelines returns every configured pipeline, in configuration order;
	// nil when there are none (no panel).
	Pipelines(ctx context.Context) ([]PipelineSummary, error)
}

// PipelineSummary is one line of the pipelines panel: what one configured
// pipeline did in this instance since it started.
type PipelineSummary struct {
	Name  string
	Topic string
	Sink  string // "upsert", "rollup" or "append"
	Table string
	// Records by result, and rows sent to the table by operation.
	Written, Filtered, Ignored, DeadLettered int64
	Upserted, Deleted, Merged, Appended      int64
}

// DeadLetterSummary is one line of the dead-letters panel: the dead letters
// of one input topic with one reason.
type DeadLetterSummary struct {
	Topic string
	// Class, Pipeline and SQLState are what the dead letters are grouped
	// by: the reason class (decode, expression, refused_by_postgres, ...),
	// the pipeline that refused them and PostgreSQL's code; empty when
	// unknown (none, or rows written before they were recorded).
	Class, Pipeline, SQLState string
	// Reason is an example of the group's errors; empty when the source
	// only counts (at-least-once mode, where the reasons are only in the
	// dead-letter topic). The server takes the record values out of it
	// unless Options.IncludeValues.
	Reason string
	Count  int64
	Last   time.Time // the latest failure; zero when unknown
}

// Pipeline is the state of one ratchet instance and the partitions it knows.
type Pipeline struct {
	Instance   string
	Group      string
	Mode       string // "exactly-once" or "at-least-once"
	Partitions []PartitionStatus
}

// PartitionStatus is the state of one partition as this instance sees it.
type PartitionStatus struct {
	Topic           string
	Partition       int32
	Owner           string
	Assigned        bool
	StoredOffset    int64 // offset stored in PostgreSQL; -1 when unknown (at-least-once)
	CommittedOffset int64 // Kafka committed offset; -1 when unknown
	EndOffset       int64 // high watermark; -1 when unknown
	Lag             int64 // negative when unknown
	Records         int64 // totals since start
	Retries         int64
	DeadLetters     int64
	Restarts        int64
	RatePerSec      float64
	Paused          bool
}

// Rollup is one row of the dashboard table: the events of one metric whose
// event time falls in one minute bucket (UTC).
type Rollup struct {
	Metric string
	Bucket time.Time
	Count  int64
	Sum    float64
	Min    float64
	Max    float64
}

// ReadinessState names the phase an instance is in.
type ReadinessState string

// The readiness states. /readyz answers 200 for StateReady and StateIdle and
// 503 for every other state.
const (
	// StateStarting: connecting and joining the group, not yet processing.
	StateStarting ReadinessState = "starting"
	// StateReady: partitions assigned and processing.
	StateReady ReadinessState = "ready"
	// StateIdle: healthy and in the group, but no partitions assigned.
	StateIdle ReadinessState = "idle"
	// StateDegraded: running, but a dependency is failing (Reason says which).
	StateDegraded ReadinessState = "degraded"
	// StateDraining: stopping; finishing in-flight work, taking no new work.
	StateDraining ReadinessState = "draining"
)

// Ready reports whether s counts as ready for /readyz.
func (s ReadinessState) Ready() bool {
	return s == StateReady || s == StateIdle
}

// Readiness is the instance's readiness and, when not ready, why.
type Readiness struct {
	State  ReadinessState
	Reason string
}
