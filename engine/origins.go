package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/processor/pipeline"
)

// definitions returns the definitions of cfg's pipelines as ratchet
// records them (store.PipelineDefinition).
func definitions(cfg config.Config) ([]store.PipelineDefinition, error) {
	out := make([]store.PipelineDefinition, 0, len(cfg.Pipelines))
	for _, p := range cfg.Pipelines {
		fp, canon, err := pipeline.Fingerprint(p)
		if err != nil {
			return nil, err
		}
		out = append(out, store.PipelineDefinition{Pipeline: p.Name, Topic: p.Topic, Fingerprint: fp, Definition: canon})
	}
	return out, nil
}

// recordDefinitions compares the configured pipelines with the definitions
// recorded for the group and records the new ones (store.RecordDefinitions).
// A pipeline whose definition changed under its name is a configuration
// error (exit code 2) saying what changed and what to do; a database error
// is returned as it is, for the start to retry.
func recordDefinitions(ctx context.Context, pool *pgxpool.Pool, cfg config.Config) (adopted int, err error) {
	defs, err := definitions(cfg)
	if err != nil {
		return 0, err
	}
	changes, adopted, err := store.RecordDefinitions(ctx, pool, cfg.Kafka.GroupID, defs)
	if err != nil {
		return 0, err
	}
	if len(changes) > 0 {
		return 0, DefinitionsChanged(cfg, changes)
	}
	return adopted, nil
}

// CheckDefinitions compares the configured pipelines with the definitions
// recorded for the group in the database q reaches, recording nothing
// (ratchet pipelines check): a changed one is the same configuration
// error ratchet run stops with.
func CheckDefinitions(ctx context.Context, cfg config.Config, q store.Querier) error {
	defs, err := definitions(cfg)
	if err != nil {
		return err
	}
	changes, err := store.CompareDefinitions(ctx, q, cfg.Kafka.GroupID, defs)
	if err != nil {
		return err
	}
	if len(changes) > 0 {
		return DefinitionsChanged(cfg, changes)
	}
	return nil
}

// DefinitionsChanged is the configuration error (exit code 2) of pipelines
// whose definition differs from the one recorded under their name: a
// problem per pipeline, naming it, with what changed and the two ways on.
func DefinitionsChanged(cfg config.Config, changes []store.DefinitionChange) *config.Error {
	index := map[string]int{}
	for i, p := range cfg.Pipelines {
		index[p.Name] = i
	}
	var ps []config.Problem
	for _, c := range changes {
		var b strings.Builder
		fmt.Fprintf(&b, "pipeline %s: its definition differs from the one recorded for it on %s (group %s); applying it would mix rows of two definitions in one table:",
			c.Pipeline, c.RecordedAt.UTC().Format("2006-01-02 15:04:05Z"), cfg.Kafka.GroupID)
		for _, line := range pipeline.DiffDefinitions(c.Recorded.Definition, c.Configured.Definition) {
			b.WriteString("\n    " + line)
		}
		fmt.Fprintf(&b, "\n  either give it a new name (then `ratchet pipelines backfill NEW_NAME --execute` fills it from the history, and the old table can be retired),"+
			"\n  or, to fix an expression whose table you truncated, forget its history on purpose: `ratchet pipelines reset %s --execute`", c.Pipeline)
		ps = append(ps, config.Problem{Key: config.PipelineKey(index[c.Pipeline]), Reason: b.String()})
	}
	return &config.Error{Problems: ps}
}
