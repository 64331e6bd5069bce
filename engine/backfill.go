package engine

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/metrics"
	"ratchet/processor/pipeline"
)

// Backfiller is what `ratchet pipelines backfill NAME` applies records
// with: the decoder of the pipeline's topic and a processor of that one
// pipeline, built by the code `ratchet run` builds them with, from the
// same configuration and database.
type Backfiller struct {
	// Topic is the pipeline's topic.
	Topic string
	// Decoder returns a decoder of the topic's records (one per partition).
	Decoder func(topic string) actors.ValueDecoder
	// Processor applies the pipeline alone.
	Processor *pipeline.Processor
	// Descending: the range is applied from its end down, each record
	// marked with pipeline.HeaderBackfill (an upsert without a version:
	// see pipeline.Set.BackfillDescending).
	Descending bool
}

// NewBackfiller compiles cfg's pipelines and returns the backfiller of
// the one named name. A pipeline that cannot be backfilled
// (pipeline.Set.Backfillable), an unknown name or a table that does not
// fit are a *config.Error or *pipeline.SchemaError (exit code 2).
func NewBackfiller(ctx context.Context, cfg config.Config, q pipeline.Querier, name string, counters pipeline.Counters) (*Backfiller, error) {
	set, err := compilePipelines(cfg, Options{})
	if err != nil {
		return nil, err
	}
	if set == nil {
		return nil, &config.Error{Problems: []config.Problem{{Key: "pipelines", Reason: "no pipelines configured"}}}
	}
	one, ok := set.Only(name)
	if !ok {
		return nil, &config.Error{Problems: []config.Problem{{Key: "pipelines",
			Reason: fmt.Sprintf("no pipeline named %q (configured: %v)", name, set.Names())}}}
	}
	if err := set.Backfillable(name); err != nil {
		return nil, &config.Error{Problems: []config.Problem{{Key: pipelineKey(cfg, name), Reason: err.Error()}}}
	}
	schema, err := pipeline.Check(ctx, q, one)
	if err != nil {
		return nil, err
	}
	m := metrics.New(prometheus.NewRegistry())
	dec, err := newDecoders(cfg, Options{}, one, m)
	if err != nil {
		return nil, err
	}
	topic, _ := one.Topic(name)
	return &Backfiller{Topic: topic, Decoder: dec, Processor: pipeline.New(one, schema, counters),
		Descending: one.BackfillDescending(name)}, nil
}

// pipelineKey is the key path of pipeline name, pipelines[i].
func pipelineKey(cfg config.Config, name string) string {
	for i, p := range cfg.Pipelines {
		if p.Name == name {
			return fmt.Sprintf("pipelines[%d]", i)
		}
	}
	return "pipelines"
}
