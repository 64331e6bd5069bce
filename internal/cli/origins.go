package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/processor/pipeline"
)

// The commands on what ratchet records of each pipeline (issue 34):
// `pipelines status` shows where each began and how far a backfill got,
// `pipelines reset NAME` forgets a pipeline's history on purpose (its
// definition changed), `pipelines forget NAME` removes the record of a
// pipeline no longer configured.

// pipelineStatus is one pipeline in `pipelines status`.
type pipelineStatus struct {
	Pipeline    string            `json:"pipeline"`
	Topic       string            `json:"topic,omitempty"`
	State       string            `json:"state"` // configured, changed, not recorded, removed
	Fingerprint string            `json:"fingerprint,omitempty"`
	RecordedAt  *time.Time        `json:"recorded_at,omitempty"`
	Partitions  []partitionStatus `json:"partitions"`
	Note        string            `json:"note,omitempty"`
}

// partitionStatus is one partition of a pipeline in `pipelines status`.
type partitionStatus struct {
	Partition int32     `json:"partition"`
	Topic     string    `json:"topic"`
	LiveFrom  int64     `json:"live_from"`
	LiveSince time.Time `json:"live_since"`
	Adopted   bool      `json:"adopted"`
	// Backfill, when one ran: its range and where it continues.
	BackfillFrom *int64 `json:"backfill_from,omitempty"`
	BackfillTo   *int64 `json:"backfill_to,omitempty"`
	BackfillNext *int64 `json:"backfill_next,omitempty"`
	Records      *int64 `json:"backfill_records,omitempty"`
	// BackfillDescending: the backfill applies its range from the end
	// down (an upsert without a version); backfill_next is then the lowest
	// offset applied.
	BackfillDescending bool `json:"backfill_descending,omitempty"`
	// Remains is what is left before live_from: "before N" when no
	// backfill ran, "N..M" (M exclusive) when one did and has not
	// finished, "none" when it has.
	Remains string `json:"remains"`
}

func pipelinesStatusCmd(ctx context.Context, e *env, args []string) error {
	fs := flags(e, "pipelines status")
	path := fs.String("config", "", "YAML configuration file (pipelines, kafka.group_id, postgres.url)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("usage: ratchet pipelines status [--config FILE] [--json]")
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	recs, err := store.ReadPipelineRecords(ctx, pool, cfg.Kafka.GroupID)
	if err != nil {
		return err
	}
	st, err := pipelineStatuses(cfg, recs)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Group     string           `json:"group"`
			Pipelines []pipelineStatus `json:"pipelines"`
		}{cfg.Kafka.GroupID, st})
	}
	writePipelineStatus(e.stdout, cfg.Kafka.GroupID, st)
	return nil
}

// pipelineStatuses joins the configured pipelines with what is recorded:
// the configured ones first, in the order of the file, then the recorded
// ones no longer configured.
func pipelineStatuses(cfg config.Config, recs store.PipelineRecords) ([]pipelineStatus, error) {
	defs := map[string]store.RecordedDefinition{}
	for _, d := range recs.Definitions {
		defs[d.Pipeline] = d
	}
	origins := map[string][]store.Origin{}
	for _, o := range recs.Origins {
		origins[o.Pipeline] = append(origins[o.Pipeline], o)
	}
	type tp struct {
		pipeline, topic string
		partition       int32
	}
	backfills := map[tp]store.Backfill{}
	for _, b := range recs.Backfills {
		backfills[tp{b.Pipeline, b.Topic, b.Partition}] = b
	}
	build := func(name string) []partitionStatus {
		var out []partitionStatus
		for _, o := range origins[name] {
			ps := partitionStatus{Partition: o.Partition, Topic: o.Topic, LiveFrom: o.LiveFrom, LiveSince: o.LiveSince, Adopted: o.Adopted,
				Remains: fmt.Sprintf("before %d", o.LiveFrom)}
			if b, ok := backfills[tp{name, o.Topic, o.Partition}]; ok {
				ps.BackfillFrom, ps.BackfillTo, ps.BackfillNext, ps.Records = &b.From, &b.To, &b.Next, &b.Records
				ps.BackfillDescending = b.Descending
				ps.Remains = "none"
				switch {
				case b.Descending && b.Next > b.From:
					ps.Remains = fmt.Sprintf("%d..%d", b.From, b.Next)
				case !b.Descending && b.Next < b.To:
					ps.Remains = fmt.Sprintf("%d..%d", b.Next, b.To)
				}
			}
			if o.Adopted && ps.BackfillFrom == nil {
				ps.Remains = fmt.Sprintf("before %d (adopted: may already be applied)", o.LiveFrom)
			}
			out = append(out, ps)
		}
		if out == nil {
			out = []partitionStatus{}
		}
		return out
	}
	var out []pipelineStatus
	configured := map[string]bool{}
	for _, p := range cfg.Pipelines {
		configured[p.Name] = true
		fp, _, err := pipeline.Fingerprint(p)
		if err != nil {
			return nil, err
		}
		s := pipelineStatus{Pipeline: p.Name, Topic: p.Topic, State: "configured", Fingerprint: fp, Partitions: build(p.Name)}
		d, ok := defs[p.Name]
		switch {
		case !ok:
			s.State, s.Note = "not recorded", "ratchet run records it at its next start"
		case d.Fingerprint != fp:
			at := d.RecordedAt
			s.State, s.RecordedAt = "changed", &at
			s.Note = "its definition differs from the recorded one: ratchet run refuses it (see ratchet pipelines check)"
		default:
			at := d.RecordedAt
			s.RecordedAt = &at
		}
		out = append(out, s)
	}
	for _, d := range recs.Definitions {
		if configured[d.Pipeline] {
			continue
		}
		at := d.RecordedAt
		out = append(out, pipelineStatus{Pipeline: d.Pipeline, State: "removed", Fingerprint: d.Fingerprint, RecordedAt: &at,
			Partitions: build(d.Pipeline), Note: "no longer configured; its record stays until: ratchet pipelines forget " + d.Pipeline + " --execute"})
	}
	// Origins without a definition (forgotten definition, or written by
	// another configuration): shown, so that nothing recorded is hidden.
	for name := range origins {
		if _, ok := defs[name]; ok || configured[name] {
			continue
		}
		out = append(out, pipelineStatus{Pipeline: name, State: "removed", Partitions: build(name),
			Note: "no longer configured; its record stays until: ratchet pipelines forget " + name + " --execute"})
	}
	return out, nil
}

func writePipelineStatus(w io.Writer, group string, st []pipelineStatus) {
	fmt.Fprintf(w, "group %s\n", group)
	if len(st) == 0 {
		fmt.Fprintln(w, "no pipelines configured or recorded")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PIPELINE\tSTATE\tTOPIC\tPARTITION\tLIVE FROM\tLIVE SINCE\tBACKFILLED\tREMAINS")
	for _, s := range st {
		if len(s.Partitions) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\n", s.Pipeline, s.State, orDash(s.Topic))
		}
		for _, p := range s.Partitions {
			back := "-"
			if p.BackfillFrom != nil {
				back = fmt.Sprintf("%d..%d next %d (%d records)", *p.BackfillFrom, *p.BackfillTo, *p.BackfillNext, *p.Records)
				if p.BackfillDescending {
					back = fmt.Sprintf("%d..%d down to %d (%d records)", *p.BackfillFrom, *p.BackfillTo, *p.BackfillNext, *p.Records)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", s.Pipeline, s.State, p.Topic, p.Partition, p.LiveFrom,
				p.LiveSince.UTC().Format(time.RFC3339), back, p.Remains)
		}
	}
	tw.Flush()
	for _, s := range st {
		if s.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", s.Pipeline, s.Note)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// pipelinesResetCmd forgets the recorded definition, origins and backfill
// positions of NAME on purpose, and records the configured definition in
// their place when NAME is configured: the remedy for a definition that
// changed (an expression fixed in a table the user truncated). Its origins
// are recorded again by the next batch ratchet run applies.
func pipelinesResetCmd(ctx context.Context, e *env, args []string) error {
	return forgetOrReset(ctx, e, args, true)
}

// pipelinesForgetCmd removes the record of NAME, a pipeline no longer in
// the configuration; it refuses a configured one.
func pipelinesForgetCmd(ctx context.Context, e *env, args []string) error {
	return forgetOrReset(ctx, e, args, false)
}

func forgetOrReset(ctx context.Context, e *env, args []string, reset bool) error {
	verb := "forget"
	if reset {
		verb = "reset"
	}
	usage := "usage: ratchet pipelines " + verb + " NAME [--execute] [--config FILE]"
	fs := flags(e, "pipelines "+verb)
	path := fs.String("config", "", "YAML configuration file (pipelines, kafka.group_id, postgres.url)")
	execute := fs.Bool("execute", false, "do it (without it: print what it would do)")
	// NAME may come before or after the flags.
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 || name == "" {
		return usagef("%s", usage)
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	var configured *config.Pipeline
	for i := range cfg.Pipelines {
		if cfg.Pipelines[i].Name == name {
			configured = &cfg.Pipelines[i]
		}
	}
	if !reset && configured != nil {
		return usagef("pipelines forget: pipeline %s is in the configuration: remove it from pipelines first (or, to accept a changed definition, use ratchet pipelines reset %s)", name, name)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	recs, err := store.ReadPipelineRecords(ctx, pool, cfg.Kafka.GroupID)
	if err != nil {
		return err
	}
	var def *store.RecordedDefinition
	for i := range recs.Definitions {
		if recs.Definitions[i].Pipeline == name {
			def = &recs.Definitions[i]
		}
	}
	var origins, backfills int
	for _, o := range recs.Origins {
		if o.Pipeline == name {
			origins++
		}
	}
	for _, b := range recs.Backfills {
		if b.Pipeline == name {
			backfills++
		}
	}
	var replace *store.PipelineDefinition
	if reset && configured != nil {
		fp, canon, err := pipeline.Fingerprint(*configured)
		if err != nil {
			return err
		}
		replace = &store.PipelineDefinition{Pipeline: name, Topic: configured.Topic, Fingerprint: fp, Definition: canon}
	}
	if def == nil && origins == 0 && backfills == 0 {
		if configured == nil {
			return usagef("pipelines %s: nothing is recorded for pipeline %s in group %s, and it is not configured", verb, name, cfg.Kafka.GroupID)
		}
		fmt.Fprintf(e.stdout, "pipeline %s: nothing is recorded in group %s: nothing to reset (ratchet run records it at its next start)\n", name, cfg.Kafka.GroupID)
		return nil
	}
	w := e.stdout
	what := fmt.Sprintf("%s and %s", plural(origins, "origin"), plural(backfills, "backfill position"))
	if def != nil {
		what = fmt.Sprintf("its definition (recorded %s, %s), %s", def.RecordedAt.UTC().Format(time.RFC3339), def.Fingerprint, what)
	}
	if !*execute {
		fmt.Fprintf(w, "pipeline %s (group %s): would forget %s.\n", name, cfg.Kafka.GroupID, what)
		if replace != nil {
			if def != nil && def.Fingerprint != replace.Fingerprint {
				fmt.Fprintln(w, "the configured definition differs from the recorded one:")
				for _, line := range pipeline.DiffDefinitions(def.Definition, replace.Definition) {
					fmt.Fprintf(w, "    %s\n", line)
				}
			}
			fmt.Fprintf(w, "would record the configured definition (%s) in its place; ratchet run then records its origins again at the next batch of each partition,\n", replace.Fingerprint)
			fmt.Fprintln(w, "and what its table holds from before is no longer told apart: truncate the table first if the old definition's rows must go.")
		}
		fmt.Fprintf(w, "\ndry run: nothing changed. Add --execute to do it.\n")
		return nil
	}
	f, err := store.ForgetPipeline(ctx, pool, cfg.Kafka.GroupID, name, replace)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "pipeline %s (group %s): forgot %s, %s and %s.\n", name, cfg.Kafka.GroupID,
		plural(int(f.Definitions), "definition"), plural(int(f.Origins), "origin"), plural(int(f.Backfills), "backfill position"))
	if replace != nil {
		fmt.Fprintf(w, "recorded the configured definition (%s); restart ratchet run for it to record the origins again.\n", replace.Fingerprint)
	}
	return nil
}
