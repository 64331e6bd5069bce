package web

import (
	"context"
	"sync/atomic"
	"time"
)

// Starting is the Source of a server that listens before the instance can
// feed it: the engine starts the HTTP server first, so that /healthz
// answers 200 and /readyz 503 ("starting", with the reason Wait gives)
// while it waits for PostgreSQL and Kafka, and hands the real Source over
// with Serve once it has one. Until then the page shows the instance with
// no partitions, no rollups and no dead letters. Safe for concurrent use.
type Starting struct {
	base   Pipeline // the instance, group and mode shown while starting
	reason atomic.Pointer[string]
	source atomic.Pointer[sourceBox]
}

// sourceBox holds a Source in an atomic.Pointer (an interface cannot be
// stored there directly).
type sourceBox struct{ s Source }

// NewStarting returns a Starting source that shows base (its instance,
// group and mode; partitions are ignored) and reason until Serve.
func NewStarting(base Pipeline, reason string) *Starting {
	base.Partitions = nil
	s := &Starting{base: base}
	s.reason.Store(&reason)
	return s
}

// Wait sets why the instance is not serving yet; /readyz shows it.
func (s *Starting) Wait(reason string) { s.reason.Store(&reason) }

// Serve hands over to src: from now on every call goes to it.
func (s *Starting) Serve(src Source) { s.source.Store(&sourceBox{s: src}) }

func (s *Starting) current() Source {
	if b := s.source.Load(); b != nil {
		return b.s
	}
	return nil
}

// Pipeline implements Source.
func (s *Starting) Pipeline(ctx context.Context) (Pipeline, error) {
	if src := s.current(); src != nil {
		return src.Pipeline(ctx)
	}
	return s.base, nil
}

// Rollups implements Source.
func (s *Starting) Rollups(ctx context.Context, since time.Time) ([]Rollup, error) {
	if src := s.current(); src != nil {
		return src.Rollups(ctx, since)
	}
	return nil, nil
}

// DeadLetters implements DeadLetterSource; it answers none while starting
// and when the Source served has no dead-letter panel.
func (s *Starting) DeadLetters(ctx context.Context) ([]DeadLetterSummary, error) {
	if ds, ok := s.current().(DeadLetterSource); ok {
		return ds.DeadLetters(ctx)
	}
	return nil, nil
}

// Pipelines implements PipelineSource; it answers nil (no panel) while
// starting and when the Source served runs no configured pipelines.
func (s *Starting) Pipelines(ctx context.Context) ([]PipelineSummary, error) {
	if ps, ok := s.current().(PipelineSource); ok {
		return ps.Pipelines(ctx)
	}
	return nil, nil
}

// Readiness implements Source: StateStarting with the reason of the last
// Wait until Serve.
func (s *Starting) Readiness() Readiness {
	if src := s.current(); src != nil {
		return src.Readiness()
	}
	return Readiness{State: StateStarting, Reason: *s.reason.Load()}
}
