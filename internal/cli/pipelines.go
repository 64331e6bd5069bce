package cli

import (
	"context"
	"errors"
	"fmt"

	"ratchet/engine"
	"ratchet/internal/store"
	"ratchet/processor/pipeline"
)

// pipelinesCmd runs `ratchet pipelines check`: the configured pipelines
// compiled and compared with the database, as `ratchet run` does at
// start. Each problem is a line naming the pipeline and the key (exit
// code 2); for a missing table it prints a CREATE TABLE that would
// satisfy the pipeline.
func pipelinesCmd(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "check" {
		return usagef("usage: ratchet pipelines check [--config FILE]")
	}
	fs := flags(e, "pipelines check")
	path := fs.String("config", "", "YAML configuration file (pipelines, postgres.url)")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	// Expressions and shapes first: they need no database.
	if err := engine.Check(cfg, engine.Options{}); err != nil {
		return err
	}
	pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	err = engine.CheckPipelines(ctx, cfg, pool)
	var se *pipeline.SchemaError
	if errors.As(err, &se) && len(se.CreateTables) > 0 {
		fmt.Fprintln(e.stdout, "-- tables that would satisfy the pipelines:")
		for _, c := range se.CreateTables {
			fmt.Fprintln(e.stdout, c)
		}
	}
	if err != nil {
		return err
	}
	for _, p := range cfg.Pipelines {
		sink, table := "upsert", ""
		if p.Upsert != nil {
			table = p.Upsert.Table
		} else {
			sink, table = "rollup", p.Rollup.Table
		}
		fmt.Fprintf(e.stdout, "pipeline %s: ok (%s %s into %s)\n", p.Name, p.Topic, sink, table)
	}
	return nil
}
