package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/config"
	"ratchet/internal/store"
)

// resetTarget is which --to-* flag chose the new positions.
type resetTarget string

const (
	toEarliest resetTarget = "--to-earliest"
	toLatest   resetTarget = "--to-latest"
	toOffset   resetTarget = "--to-offset"
	toDatetime resetTarget = "--to-datetime"
	shiftBy    resetTarget = "--shift-by"
)

// resetOptions is a parsed `ratchet offsets reset` command line.
type resetOptions struct {
	config     string
	target     resetTarget
	offset     int64     // --to-offset
	at         time.Time // --to-datetime
	shift      int64     // --shift-by
	topic      string    // empty: every input topic
	partitions []int32   // nil: all
	execute    bool
}

// parseResetArgs parses the flags of `ratchet offsets reset`. Every problem
// is a usage error (exit 2) that names the flag.
func parseResetArgs(e *env, args []string) (resetOptions, error) {
	var o resetOptions
	fs := flags(e, "offsets reset")
	fs.StringVar(&o.config, "config", "", "YAML configuration file (environment variables RATCHET_* win)")
	earliest := fs.Bool("to-earliest", false, "move to the start of the log")
	latest := fs.Bool("to-latest", false, "move to the end of the log (skip everything not yet applied)")
	offset := fs.String("to-offset", "", "move to offset `N` (clamped to the log)")
	datetime := fs.String("to-datetime", "", "move to the first record at or after `RFC3339` time")
	shift := fs.String("shift-by", "", "move by `N` records from the current position (negative: back)")
	fs.StringVar(&o.topic, "topic", "", "only this input topic (default: every topic of kafka.topics)")
	parts := fs.String("partitions", "", "only these partitions, comma-separated (default: all)")
	fs.BoolVar(&o.execute, "execute", false, "apply the plan (without it nothing is changed)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ratchet offsets reset (--to-earliest | --to-latest | --to-offset N | --to-datetime RFC3339 | --shift-by N)")
		fmt.Fprintln(fs.Output(), "                             [--topic T] [--partitions 0,3,5] [--execute] [--config FILE]")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return o, err
	}
	var chosen []resetTarget
	if *earliest {
		chosen = append(chosen, toEarliest)
	}
	if *latest {
		chosen = append(chosen, toLatest)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["to-offset"] {
		chosen = append(chosen, toOffset)
		n, err := strconv.ParseInt(strings.TrimSpace(*offset), 10, 64)
		switch {
		case err != nil:
			return o, usagef("offsets reset: --to-offset %q is not an offset (allowed: an integer >= 0)", *offset)
		case n < 0:
			return o, usagef("offsets reset: --to-offset %d is negative (allowed: an integer >= 0)", n)
		}
		o.offset = n
	}
	if set["to-datetime"] {
		chosen = append(chosen, toDatetime)
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(*datetime))
		if err != nil {
			return o, usagef("offsets reset: --to-datetime %q is not an RFC 3339 time (e.g. 2026-12-03T14:00:00Z)", *datetime)
		}
		o.at = t
	}
	if set["shift-by"] {
		chosen = append(chosen, shiftBy)
		n, err := strconv.ParseInt(strings.TrimSpace(*shift), 10, 64)
		if err != nil {
			return o, usagef("offsets reset: --shift-by %q is not an integer", *shift)
		}
		o.shift = n
	}
	all := "--to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by"
	switch len(chosen) {
	case 0:
		return o, usagef("offsets reset: one of %s is required", all)
	case 1:
		o.target = chosen[0]
	default:
		return o, usagef("offsets reset: %s and %s cannot be combined (give exactly one of %s)", chosen[0], chosen[1], all)
	}
	if set["topic"] && strings.TrimSpace(o.topic) == "" {
		return o, usagef("offsets reset: --topic must not be empty")
	}
	if set["partitions"] {
		ps, err := parsePartitions(*parts)
		if err != nil {
			return o, usagef("offsets reset: --partitions %q: %v", *parts, err)
		}
		o.partitions = ps
	}
	return o, nil
}

// parsePartitions parses "0,3,5": partition numbers >= 0, each once.
func parsePartitions(s string) ([]int32, error) {
	var out []int32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a partition number (allowed: integers >= 0, comma-separated)", f)
		}
		if slices.Contains(out, int32(n)) {
			return nil, fmt.Errorf("partition %d is listed twice", n)
		}
		out = append(out, int32(n))
	}
	slices.Sort(out)
	return out, nil
}

// resetRow is one partition of a reset plan.
type resetRow struct {
	Topic     string
	Partition int32
	Low, High int64 // the log's start and end
	Committed int64 // Kafka committed offset; -1: none
	Epoch     int64 // stored epoch; 0: no row
	Stored    int64 // stored position; -1: no row
	Current   int64 // the group's position now (stored or committed by mode); -1: none
	To        int64
	Note      string
}

// resetPlan is what `ratchet offsets reset` would do.
type resetPlan struct {
	group string
	mode  string
	rows  []resetRow
	// active says the group had members at planning time.
	active bool
	state  string
}

func offsetsResetCmd(ctx context.Context, e *env, args []string) error {
	o, err := parseResetArgs(e, args)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(e, o.config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	k, err := openKafka(cfg, cfg.Kafka.GroupID)
	if err != nil {
		return err
	}
	defer k.Close()
	var pool *pgxpool.Pool
	if cfg.Commit.Mode == config.ModeExactlyOnce {
		if pool, err = store.Open(ctx, cfg.Postgres.URL.Reveal(), 2); err != nil {
			return err
		}
		defer pool.Close()
	}
	plan, err := planReset(ctx, cfg, k, pool, o)
	if err != nil {
		return err
	}
	if !o.execute {
		writeResetPlan(e.stdout, plan)
		return nil
	}
	return executeReset(ctx, e.stdout, cfg, k, pool, o, plan)
}

// planReset reads the positions and the logs and computes the new
// positions. It changes nothing.
func planReset(ctx context.Context, cfg config.Config, k *kafkaTool, pool *pgxpool.Pool, o resetOptions) (resetPlan, error) {
	plan := resetPlan{group: cfg.Kafka.GroupID, mode: cfg.Commit.Mode}
	topics := cfg.Kafka.Topics
	if o.topic != "" {
		if !slices.Contains(cfg.Kafka.Topics, o.topic) {
			return plan, usagef("offsets reset: --topic %q is not an input topic (kafka.topics: %s)", o.topic, strings.Join(cfg.Kafka.Topics, ","))
		}
		topics = []string{o.topic}
	}
	all, err := k.topics()
	if err != nil {
		return plan, err
	}
	var stored []store.StoredOffset
	if pool != nil {
		stored, err = store.Offsets(ctx, pool, cfg.Kafka.GroupID)
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") { // 42P01: not migrated yet
			return plan, err
		}
		if err != nil {
			return plan, errors.New("offsets reset: the database has no ratchet_offsets table yet; run `ratchet migrate` first")
		}
	}
	if plan.active, plan.state, err = k.groupActive(ctx, cfg.Kafka.GroupID); err != nil {
		return plan, err
	}
	for _, topic := range topics {
		parts, ok := all[topic]
		if !ok {
			if o.topic != "" {
				return plan, usagef("offsets reset: --topic %q does not exist in Kafka", topic)
			}
			return plan, fmt.Errorf("offsets reset: input topic %q does not exist in Kafka", topic)
		}
		if o.partitions != nil {
			for _, p := range o.partitions {
				if !slices.Contains(parts, p) {
					return plan, usagef("offsets reset: --partitions: %s has no partition %d (it has 0..%d)", topic, p, len(parts)-1)
				}
			}
			parts = o.partitions
		}
		committed, err := k.committed(topic, parts)
		if err != nil {
			return plan, err
		}
		var times []kafka.TopicPartition
		for _, p := range parts {
			low, high, err := k.c.QueryWatermarkOffsets(topic, p, kafkaTimeoutMs)
			if err != nil {
				return plan, fmt.Errorf("watermarks of %s[%d]: %w", topic, p, err)
			}
			r := resetRow{Topic: topic, Partition: p, Low: low, High: high, Committed: committed[p], Stored: -1, Current: -1}
			for _, s := range stored {
				if s.Topic == topic && s.Partition == p {
					r.Stored, r.Epoch = s.Next, s.Epoch
				}
			}
			if cfg.Commit.Mode == config.ModeExactlyOnce {
				r.Current = r.Stored
			} else {
				r.Current = r.Committed
			}
			plan.rows = append(plan.rows, r)
			if o.target == toDatetime {
				t := topic
				times = append(times, kafka.TopicPartition{Topic: &t, Partition: p, Offset: kafka.Offset(o.at.UnixMilli())})
			}
		}
		if len(times) > 0 {
			res, err := k.c.OffsetsForTimes(times, kafkaTimeoutMs)
			if err != nil {
				return plan, fmt.Errorf("offsets for %s of %s: %w", o.at.Format(time.RFC3339), topic, err)
			}
			for _, tp := range res {
				if tp.Error != nil {
					return plan, fmt.Errorf("offset for %s of %s[%d]: %w", o.at.Format(time.RFC3339), topic, tp.Partition, tp.Error)
				}
				for i := range plan.rows {
					if r := &plan.rows[i]; r.Topic == topic && r.Partition == tp.Partition {
						r.To = int64(tp.Offset) // -1: no record at or after the time
					}
				}
			}
		}
	}
	for i := range plan.rows {
		r := &plan.rows[i]
		r.To, r.Note = target(o, *r, r.Current, cfg.Kafka.AutoOffsetReset)
	}
	return plan, nil
}

// target computes a partition's new position from the option, the log's
// bounds and the current position (-1: none), and says when it was clamped
// to the log. A pure function: planReset calls it with the position it
// read, and the exactly-once move calls it again with the position found
// under the row lock, for --shift-by.
func target(o resetOptions, r resetRow, current int64, autoReset string) (int64, string) {
	clamp := func(v int64) (int64, string) {
		switch {
		case v < r.Low:
			return r.Low, fmt.Sprintf("%d is before the log start: clamped to %d", v, r.Low)
		case v > r.High:
			return r.High, fmt.Sprintf("%d is after the log end: clamped to %d", v, r.High)
		}
		return v, ""
	}
	switch o.target {
	case toEarliest:
		return r.Low, ""
	case toLatest:
		return r.High, ""
	case toOffset:
		return clamp(o.offset)
	case toDatetime:
		if r.To < 0 {
			return r.High, "no record at or after that time: clamped to the log end"
		}
		return clamp(r.To)
	case shiftBy:
		base, note := current, ""
		if base < 0 {
			// No position yet: where the engine would start.
			base = r.Committed
			if base < 0 || base > r.High || base < r.Low {
				base = r.Low
				if autoReset == "latest" {
					base = r.High
				}
			}
			note = fmt.Sprintf("no position yet: shifted from the start position %d", base)
		}
		to, clamped := clamp(base + o.shift)
		if clamped != "" {
			note = clamped
		}
		return to, note
	}
	return current, ""
}

// plural returns "1 thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

func dash(v int64) string {
	if v < 0 {
		return "-"
	}
	return strconv.FormatInt(v, 10)
}

func diff(from, to int64) string {
	if from < 0 {
		return "-"
	}
	return fmt.Sprintf("%+d", to-from)
}

func writeResetPlan(w io.Writer, plan resetPlan) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tCURRENT\tNEW\tDIFFERENCE\tNOTE")
	for _, r := range plan.rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", r.Topic, r.Partition, dash(r.Current), r.To, diff(r.Current, r.To), r.Note)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\ndry run: nothing changed (group %s, mode %s). Add --execute to apply this plan.\n", plan.group, plan.mode)
	if plan.mode == config.ModeAtLeastOnce && plan.active {
		fmt.Fprintf(w, "note: the group has active members (state %s); --execute refuses until they have stopped.\n", plan.state)
	}
}

// errResetIncomplete marks a reset that left some partitions unmoved.
var errResetIncomplete = errors.New("reset incomplete")

func executeReset(ctx context.Context, w io.Writer, cfg config.Config, k *kafkaTool, pool *pgxpool.Pool, o resetOptions, plan resetPlan) error {
	if cfg.Commit.Mode == config.ModeAtLeastOnce {
		return executeResetKafka(ctx, w, k, plan)
	}
	moves := make([]store.OffsetMove, len(plan.rows))
	for i, r := range plan.rows {
		m := store.OffsetMove{Topic: r.Topic, Partition: r.Partition, Epoch: r.Epoch, From: r.Stored, To: r.To}
		if o.target == shiftBy {
			r := r
			m.Target = func(current int64) int64 {
				to, _ := target(o, r, current, cfg.Kafka.AutoOffsetReset)
				return to
			}
		}
		moves[i] = m
	}
	res, err := store.ResetOffsets(ctx, pool, plan.group, moves)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tFROM\tTO\tDIFFERENCE\tRESULT")
	var moved []kafka.TopicPartition
	changed := 0
	for _, r := range res {
		if r.Moved {
			t := r.Topic
			moved = append(moved, kafka.TopicPartition{Topic: &t, Partition: r.Partition, Offset: kafka.Offset(r.To)})
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\tmoved\n", r.Topic, r.Partition, dash(r.FoundNext), r.To, diff(r.FoundNext, r.To))
			continue
		}
		changed++
		now := "row gone"
		if r.FoundEpoch > 0 {
			now = fmt.Sprintf("now epoch %d at %d", r.FoundEpoch, r.FoundNext)
		}
		planned := "no row"
		if r.Epoch > 0 {
			planned = fmt.Sprintf("epoch %d", r.Epoch)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t-\tNOT MOVED: claimed since the plan (planned %s, %s)\n",
			r.Topic, r.Partition, dash(r.From), r.To, planned, now)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nmoved %d of %d partitions in ratchet_offsets (group %s, mode exactly-once).\n", len(moved), len(res), plan.group)
	active, state, err := k.groupActive(ctx, plan.group)
	switch {
	case err != nil:
		return fmt.Errorf("the store was reset, but Kafka's committed offsets were not updated: %w", err)
	case active:
		fmt.Fprintf(w, "the group has active members (state %s): each owner resumes from its new position within about a second (an idle partition too) and commits it to Kafka.\n", state)
	case len(moved) > 0:
		if err := k.commitOffsets(moved); err != nil {
			return fmt.Errorf("the store was reset (it is what the engine starts from), but Kafka's committed offsets were not updated: %w", err)
		}
		fmt.Fprintf(w, "the group has no active members: committed the new offsets to Kafka too.\n")
	}
	if changed > 0 {
		return fmt.Errorf("%w: %d partitions were claimed by an instance since the plan and were left as they are; run the command again", errResetIncomplete, changed)
	}
	return nil
}

// executeResetKafka applies an at-least-once plan: Kafka's committed
// offsets are the position, and like Kafka's own tool it refuses while the
// group has members (their next commit would overwrite the reset).
func executeResetKafka(ctx context.Context, w io.Writer, k *kafkaTool, plan resetPlan) error {
	active, state, err := k.groupActive(ctx, plan.group)
	if err != nil {
		return err
	}
	if active {
		return fmt.Errorf("offsets reset: group %s has active members (state %s); in at-least-once mode Kafka's committed offsets are the position, and a running member would overwrite them: stop every instance, then run again",
			plan.group, state)
	}
	offsets := make([]kafka.TopicPartition, len(plan.rows))
	for i, r := range plan.rows {
		t := r.Topic
		offsets[i] = kafka.TopicPartition{Topic: &t, Partition: r.Partition, Offset: kafka.Offset(r.To)}
	}
	if err := k.commitOffsets(offsets); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tFROM\tTO\tDIFFERENCE\tRESULT")
	for _, r := range plan.rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\tcommitted\n", r.Topic, r.Partition, dash(r.Current), r.To, diff(r.Current, r.To))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\ncommitted %d offsets to Kafka (group %s, mode at-least-once).\n", len(offsets), plan.group)
	return nil
}
