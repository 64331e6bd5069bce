package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"time"

	"ratchet/engine"
	"ratchet/internal/store"
	"ratchet/processor/pipeline"
)

// pipelinesCmd runs `ratchet pipelines check`: the configured pipelines
// compiled and compared with the database, as `ratchet run` does at
// start. Each problem is a line naming the pipeline and the key (exit
// code 2); for a missing table it prints a CREATE TABLE that would
// satisfy the pipeline. With --sample N it then runs the pipelines on the
// last N records of each topic (sample.go) and exits 2 when one would
// dead-letter more than --threshold of them.
func pipelinesCmd(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return pipelinesStatusCmd(ctx, e, args[1:])
		case "backfill":
			return backfillCmd(ctx, e, args[1:])
		case "reset":
			return pipelinesResetCmd(ctx, e, args[1:])
		case "forget":
			return pipelinesForgetCmd(ctx, e, args[1:])
		}
	}
	if len(args) == 0 || args[0] != "check" {
		return usagef("%s", "usage: ratchet pipelines check [--config FILE] [--sample N [--threshold F]]\n"+
			"       ratchet pipelines status [--config FILE] [--json]\n"+
			"       "+backfillUsage[len("usage: "):]+"\n"+
			"       ratchet pipelines reset NAME [--execute] [--config FILE]\n"+
			"       ratchet pipelines forget NAME [--execute] [--config FILE]")
	}
	fs := flags(e, "pipelines check")
	path := fs.String("config", "", "YAML configuration file (pipelines, postgres.url)")
	sample := fs.Int64("sample", 0, "also run the pipelines on the last N records of each topic (split over its partitions), in a transaction that is rolled back")
	threshold := fs.Float64("threshold", defaultSampleThreshold, "with --sample: exit 2 when a pipeline would dead-letter more than this share of its sample (0 to 1)")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	thresholdSet := false
	fs.Visit(func(f *flag.Flag) { thresholdSet = thresholdSet || f.Name == "threshold" })
	switch {
	case *sample < 0:
		return usagef("pipelines check: --sample %d: a number of records, 0 or more", *sample)
	case math.IsNaN(*threshold) || *threshold < 0 || *threshold > 1:
		return usagef("pipelines check: --threshold %v: a share of the sample, from 0 to 1", *threshold)
	case thresholdSet && *sample == 0:
		return usagef("pipelines check: --threshold needs --sample")
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
	// A pipeline whose definition changed under its name: ratchet run
	// would refuse it, with the same message.
	if err := engine.CheckDefinitions(ctx, cfg, pool); err != nil {
		return err
	}
	for _, p := range cfg.Pipelines {
		sink, table := "upsert", ""
		switch {
		case p.Upsert != nil:
			table = p.Upsert.Table
		case p.Append != nil:
			sink, table = "append", p.Append.Table
		default:
			sink, table = "rollup", p.Rollup.Table
		}
		fmt.Fprintf(e.stdout, "pipeline %s: ok (%s %s into %s)\n", p.Name, p.Topic, sink, table)
	}
	if *sample == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	return runSample(ctx, e.stdout, cfg, pool, *sample, *threshold)
}
