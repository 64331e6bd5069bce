package engine

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/metrics"
	"ratchet/internal/web"
	"ratchet/processor/pipeline"
)

// errPipelinesAndProcessor refuses a run given both configured pipelines
// and a processor or decoder of its own (engine.Options): which one
// applies would be a guess. A configuration error: exit code 2.
var errPipelinesAndProcessor = &config.Error{Problems: []config.Problem{{Key: "pipelines",
	Reason: "configured, and this program brings a processor or decoder of its own: use one or the other"}}}

// compilePipelines compiles cfg's pipelines (nil when there are none).
// Problems are a *config.Error (exit code 2).
func compilePipelines(cfg config.Config, opts Options) (*pipeline.Set, error) {
	if len(cfg.Pipelines) == 0 {
		return nil, nil
	}
	if opts.Processor != nil || opts.Decoder != nil {
		return nil, errPipelinesAndProcessor
	}
	return pipeline.Compile(cfg)
}

// warnRollupReplays warns, once per run, that with commit.mode
// at-least-once the rollups count replayed records again: after a crash
// the records since the last commit are applied a second time, and a sum
// or a count cannot tell; appends, that their rows are appended again.
// Upserts are not named: a replay writes the same rows again.
func warnRollupReplays(cfg config.Config, log *slog.Logger) {
	if cfg.Commit.Mode != config.ModeAtLeastOnce {
		return
	}
	var rollups, appends []string
	for _, p := range cfg.Pipelines {
		if p.Rollup != nil {
			rollups = append(rollups, p.Name)
		}
		if p.Append != nil {
			appends = append(appends, p.Name)
		}
	}
	if len(appends) > 0 {
		log.Warn("append pipelines with commit.mode at-least-once: records replayed after a crash are appended twice (use exactly-once for one row per record)",
			"pipelines", appends)
	}
	if len(rollups) > 0 {
		log.Warn("rollup pipelines with commit.mode at-least-once: records replayed after a crash are counted twice (use exactly-once for exact aggregates)",
			"pipelines", rollups)
	}
}

// bindPipelines checks the pipelines against the database and returns
// their processor. A schema that does not fit is a *pipeline.SchemaError
// (a configuration error, exit code 2), not retried.
func bindPipelines(ctx context.Context, q pipeline.Querier, set *pipeline.Set, m *metrics.Metrics) (*pipeline.Processor, error) {
	schema, err := pipeline.Check(ctx, q, set)
	if err != nil {
		return nil, err
	}
	return pipeline.New(set, schema, pipelineCounters{m}), nil
}

// newGuard returns the instance's pipeline guard (actors.Guard), each
// configured pipeline's failure guard armed with its pipelines[].errors.
// Without pipelines it still holds partitions on a configuration error.
func newGuard(cfg config.Config, m *metrics.Metrics, log *slog.Logger) *actors.Guard {
	g := actors.NewGuard(m, log)
	g.IncludeValues = cfg.Log.IncludeValues
	for _, p := range cfg.Pipelines {
		l := p.Errors.Limits()
		g.Watch(p.Name, p.Topic, actors.GuardLimits{MaxRatio: l.MaxRatio, MinFailures: l.MinFailures, Window: l.Window})
	}
	return g
}

// pipelineCounters counts into the engine's metrics.
type pipelineCounters struct{ m *metrics.Metrics }

func (c pipelineCounters) Records(name, result string, n int) {
	if n > 0 {
		c.m.PipelineRecords.WithLabelValues(name, result).Add(float64(n))
	}
}

func (c pipelineCounters) Rows(name, op string, n int) {
	if n > 0 {
		c.m.PipelineRows.WithLabelValues(name, op).Add(float64(n))
	}
}

// CheckPipelines compiles cfg's pipelines and checks them against the
// database q reaches (ratchet pipelines check). The error is a
// *config.Error or *pipeline.SchemaError for a configuration that does
// not fit, otherwise the database's.
func CheckPipelines(ctx context.Context, cfg config.Config, q pipeline.Querier) error {
	set, err := compilePipelines(cfg, Options{})
	if err != nil {
		return err
	}
	if set == nil {
		return &config.Error{Problems: []config.Problem{{Key: "pipelines", Reason: "no pipelines configured"}}}
	}
	if _, err := pipeline.Check(ctx, q, set); err != nil {
		return err
	}
	return nil
}

// pipelineSource is the page's source when pipelines are configured: it
// adds the pipelines panel (web.PipelineSource), read from this
// instance's counters.
type pipelineSource struct {
	*source
	m *metrics.Metrics
}

// Pipelines implements web.PipelineSource.
func (s *pipelineSource) Pipelines(context.Context) ([]web.PipelineSummary, error) {
	out := make([]web.PipelineSummary, 0, len(s.cfg.Pipelines))
	for _, p := range s.cfg.Pipelines {
		ps := web.PipelineSummary{Name: p.Name, Topic: p.Topic, Sink: "upsert"}
		if p.Upsert != nil {
			ps.Table = p.Upsert.Table
		} else if p.Rollup != nil {
			ps.Sink, ps.Table = "rollup", p.Rollup.Table
		} else if p.Append != nil {
			ps.Sink, ps.Table = "append", p.Append.Table
		}
		rec := func(result string) int64 { return counterValue(s.m.PipelineRecords, p.Name, result) }
		rows := func(op string) int64 { return counterValue(s.m.PipelineRows, p.Name, op) }
		ps.Written, ps.Filtered, ps.Ignored, ps.DeadLettered = rec("written"), rec("filtered"), rec("ignored"), rec("dead_lettered")
		ps.Upserted, ps.Deleted, ps.Merged, ps.Appended = rows("upserted"), rows("deleted"), rows("merged"), rows("appended")
		out = append(out, ps)
	}
	return out, nil
}

// counterValue reads one counter of vec; 0 when it was never counted.
func counterValue(vec *prometheus.CounterVec, labels ...string) int64 {
	c, err := vec.GetMetricWithLabelValues(labels...)
	if err != nil {
		return 0
	}
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return int64(m.GetCounter().GetValue())
}
