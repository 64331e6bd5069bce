package engine

import (
	"context"
	"errors"

	"ratchet/config"
	"ratchet/internal/metrics"
	"ratchet/processor/pipeline"
)

// errPipelinesAndProcessor refuses a run given both configured pipelines
// and a processor of its own: which one applies would be a guess.
var errPipelinesAndProcessor = errors.New("pipelines are configured and a processor was given too: use one or the other")

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
