package engine

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/metrics"
	"ratchet/processor/pipeline"
)

// Sampler is what `ratchet pipelines check --sample` runs records
// through: the per-topic decoders and the pipelines' processor exactly as
// `ratchet run` builds them from the same configuration and database, so a
// sample is decoded and evaluated by the code that will run, not by a
// second path. Its metrics go to a registry of its own.
type Sampler struct {
	// Decoder returns the decoder of a topic's records (a new one per call,
	// as each partition gets its own).
	Decoder func(topic string) actors.ValueDecoder
	// Processor applies the pipelines, counting into the counters given to
	// NewSampler.
	Processor *pipeline.Processor
}

// NewSampler compiles cfg's pipelines, checks them against the database q
// reaches and returns their decoders and processor. Errors are those of
// CheckPipelines.
func NewSampler(ctx context.Context, cfg config.Config, q pipeline.Querier, counters pipeline.Counters) (*Sampler, error) {
	set, err := compilePipelines(cfg, Options{})
	if err != nil {
		return nil, err
	}
	if set == nil {
		return nil, &config.Error{Problems: []config.Problem{{Key: "pipelines", Reason: "no pipelines configured"}}}
	}
	schema, err := pipeline.Check(ctx, q, set)
	if err != nil {
		return nil, err
	}
	m := metrics.New(prometheus.NewRegistry())
	dec, err := newDecoders(cfg, Options{}, set, m)
	if err != nil {
		return nil, err
	}
	return &Sampler{Decoder: dec, Processor: pipeline.New(set, schema, counters)}, nil
}
