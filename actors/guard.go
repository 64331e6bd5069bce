package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"ratchet/internal/metrics"
)

// The pipeline guard: what stops a partition for a fault no record is to
// blame for. Two kinds:
//
//   - A configuration error: the table refuses the statement whatever the
//     records (store.IsConfigurationError). The retry actor retries the
//     batch like an outage and reports it here while it lasts; readiness
//     names the pipeline and the table, one ERROR line says what is wrong
//     when the first partition meets it.
//   - A tripped failure guard: too many of a pipeline's records failed
//     within its window (a typo in a field path, a where that is not a
//     bool). From then on nothing of the pipeline's topic is applied or
//     dead-lettered by this instance: its partitions hold their batch
//     until the process stops. Fixing the configuration and restarting
//     re-arms it; the records dead-lettered before the trip are in the
//     dead-letter topic, for `ratchet dlq replay`.

// GuardLimits are when a pipeline's failure guard trips: when, among the
// last Window records of its topic that the pipeline saw, at least
// MinFailures failed and more than MaxRatio of them did. MaxRatio 1 (or
// more) never trips.
type GuardLimits struct {
	MaxRatio    float64
	MinFailures int
	Window      int
}

// Guard is shared by the instance's partitions. Safe for concurrent use; a
// nil *Guard guards nothing.
type Guard struct {
	m   *metrics.Metrics
	log *slog.Logger
	// IncludeValues keeps the record values a failure's reason quotes in
	// the sample the guard logs (log.include_values); set before use.
	IncludeValues bool

	mu      sync.Mutex
	byName  map[string]*guarded
	byTopic map[string][]*guarded
	// waiting holds the partitions retrying a configuration error, by
	// partition.
	waiting map[TopicPartition]ConfigFault
}

// ConfigFault is a partition waiting on a configuration error.
type ConfigFault struct {
	TP       TopicPartition
	Pipeline string // empty: not a configured pipeline
	Table    string
	Err      error
}

// TrippedPipeline is a pipeline whose failure guard tripped.
type TrippedPipeline struct {
	Pipeline, Topic string
	Failures, Seen  int    // in the window when it tripped
	Sample          string // one failure's reason
}

type guarded struct {
	name, topic string
	limits      GuardLimits
	ring        []bool // the last Window outcomes, true: failed
	next, n     int    // ring position, outcomes held
	failures    int    // true values in ring
	tripped     *TrippedPipeline
}

// NewGuard returns a guard that counts into m and logs to log.
func NewGuard(m *metrics.Metrics, log *slog.Logger) *Guard {
	return &Guard{m: m, log: log, byName: map[string]*guarded{}, byTopic: map[string][]*guarded{},
		waiting: map[TopicPartition]ConfigFault{}}
}

// Watch arms the failure guard of pipeline, which reads topic.
func (g *Guard) Watch(pipeline, topic string, l GuardLimits) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := &guarded{name: pipeline, topic: topic, limits: l, ring: make([]bool, max(1, l.Window))}
	g.byName[pipeline] = p
	g.byTopic[topic] = append(g.byTopic[topic], p)
}

func (p *guarded) push(failed bool) {
	if p.n == len(p.ring) {
		if p.ring[p.next] {
			p.failures--
		}
	} else {
		p.n++
	}
	p.ring[p.next] = failed
	if failed {
		p.failures++
	}
	p.next = (p.next + 1) % len(p.ring)
}

// Applied counts n records of topic applied (each pipeline of the topic
// wrote, filtered or ignored them).
func (g *Guard) Applied(topic string, n int) {
	if g == nil || n <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.byTopic[topic] {
		if p.tripped != nil {
			continue
		}
		for range min(n, len(p.ring)) {
			p.push(false)
		}
	}
}

// Failed counts a record that failed for pipeline with reason, and reports
// whether the guard of the pipeline's topic has tripped (by this failure
// or an earlier one): then the record must not be dead-lettered, its
// partition holds. A pipeline the guard does not watch never trips.
func (g *Guard) Failed(pipeline string, reason error) bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.byName[pipeline]
	if p == nil {
		return false
	}
	if g.heldLocked(p.topic) != nil {
		return true
	}
	p.push(true)
	l := p.limits
	if p.failures < l.MinFailures || float64(p.failures) <= l.MaxRatio*float64(p.n) {
		return false
	}
	p.tripped = &TrippedPipeline{Pipeline: p.name, Topic: p.topic, Failures: p.failures, Seen: p.n, Sample: reasonText(reason, g.IncludeValues)}
	g.m.PipelineGuardTripped.WithLabelValues(p.name).Set(1)
	g.log.Error("pipeline failure guard tripped: its topic is held until the configuration is fixed and ratchet restarted",
		"pipeline", p.name, "topic", p.topic, "failures", p.failures, "records", p.n,
		"max_ratio", l.MaxRatio, "min_failures", l.MinFailures, "sample", p.tripped.Sample,
		"advice", "fix the pipeline, restart, then `ratchet dlq replay --execute` the records dead-lettered before the trip")
	return true
}

// Held returns the tripped pipeline that holds topic, or nil.
func (g *Guard) Held(topic string) *TrippedPipeline {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.heldLocked(topic)
}

func (g *Guard) heldLocked(topic string) *TrippedPipeline {
	for _, p := range g.byTopic[topic] {
		if p.tripped != nil {
			return p.tripped
		}
	}
	return nil
}

// Tripped returns the tripped pipelines, by name.
func (g *Guard) Tripped() []TrippedPipeline {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []TrippedPipeline
	for _, p := range g.byName {
		if p.tripped != nil {
			out = append(out, *p.tripped)
		}
	}
	slices.SortFunc(out, func(a, b TrippedPipeline) int { return strings.Compare(a.Pipeline, b.Pipeline) })
	return out
}

// pipelineOf returns the pipeline and table an error names (a configured
// pipeline's RecordError), or empty strings.
func pipelineOf(err error) (pipeline, table string) {
	var pl interface{ PipelineName() string }
	if errors.As(err, &pl) {
		pipeline = pl.PipelineName()
	}
	var tb interface{ TableName() string }
	if errors.As(err, &tb) {
		table = tb.TableName()
	}
	return pipeline, table
}

// configWaiting records that tp retries a configuration error; the first
// partition to meet one of a pipeline logs it, with advice.
func (g *Guard) configWaiting(tp TopicPartition, err error) {
	if g == nil {
		return
	}
	pipeline, table := pipelineOf(err)
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, ok := g.waiting[tp]; ok && old.Pipeline == pipeline {
		g.waiting[tp] = ConfigFault{TP: tp, Pipeline: pipeline, Table: table, Err: err}
		return
	} else if ok {
		g.m.PipelineConfigWaiting.WithLabelValues(old.Pipeline).Dec()
	}
	first := true
	for _, f := range g.waiting {
		if f.Pipeline == pipeline {
			first = false
		}
	}
	g.waiting[tp] = ConfigFault{TP: tp, Pipeline: pipeline, Table: table, Err: err}
	g.m.PipelineConfigWaiting.WithLabelValues(pipeline).Inc()
	if first {
		g.m.PipelineConfigErrors.WithLabelValues(pipeline).Inc()
		g.log.Error("table refuses the pipeline's statement whatever the records; its partitions wait, nothing is dead-lettered",
			"pipeline", pipeline, "table", table, "topic", tp.Topic, "partition", tp.Partition, "err", err,
			"advice", "fix the table (ratchet pipelines check says what it needs); the waiting records then apply")
	}
}

// configCleared records that tp no longer waits on a configuration
// error: its batch applied (recovered), or the partition stopped.
func (g *Guard) configCleared(tp TopicPartition, recovered bool) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.waiting[tp]; ok {
		delete(g.waiting, tp)
		g.m.PipelineConfigWaiting.WithLabelValues(f.Pipeline).Dec()
		if recovered {
			g.log.Info("table accepts the pipeline's statement again", "pipeline", f.Pipeline, "table", f.Table,
				"topic", tp.Topic, "partition", tp.Partition)
		}
	}
}

// ConfigFaults returns the partitions waiting on a configuration error.
func (g *Guard) ConfigFaults() []ConfigFault {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]ConfigFault, 0, len(g.waiting))
	for _, f := range g.waiting {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b ConfigFault) int {
		if c := strings.Compare(a.TP.Topic, b.TP.Topic); c != 0 {
			return c
		}
		return int(a.TP.Partition - b.TP.Partition)
	})
	return out
}

// Reason says why the guard holds partitions, for readiness; empty when
// it holds none.
func (g *Guard) Reason() string {
	if t := g.Tripped(); len(t) > 0 {
		return fmt.Sprintf("pipeline %s: failure guard tripped (%d of the last %d records failed), topic %s held until fixed and restarted",
			t[0].Pipeline, t[0].Failures, t[0].Seen, t[0].Topic)
	}
	if f := g.ConfigFaults(); len(f) > 0 {
		if f[0].Pipeline == "" {
			return fmt.Sprintf("%s[%d]: waiting on a configuration error: %v", f[0].TP.Topic, f[0].TP.Partition, f[0].Err)
		}
		return fmt.Sprintf("pipeline %s: table %s refuses its statement (%d partition(s) waiting): %v",
			f[0].Pipeline, f[0].Table, len(f), f[0].Err)
	}
	return ""
}
