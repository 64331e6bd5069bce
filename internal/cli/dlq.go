package cli

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/redact"
	"ratchet/internal/store"
	"ratchet/internal/tracing"
)

// HeaderReplayedFrom marks a record that `ratchet dlq replay` re-produced:
// "<dlq topic>/<partition>/<offset>" of the dead letter it came from. A
// rerun finds an interrupted run's records by it.
const HeaderReplayedFrom = "ratchet.replayed_from"

// dlqHeaders are the headers the DLQ actor adds; everything else on a dead
// letter is the original record's.
var dlqHeaders = []string{actors.HeaderError, actors.HeaderTopic, actors.HeaderPartition, actors.HeaderOffset,
	actors.HeaderAttempts, actors.HeaderFailedAt, actors.HeaderReason, actors.HeaderPipeline, actors.HeaderSQLState,
	HeaderReplayedFrom, actors.HeaderReplayGroup}

func dlqCmd(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "ls":
			return dlqLsCmd(ctx, e, args[1:])
		case "replay":
			return dlqReplayCmd(ctx, e, args[1:])
		}
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintln(e.stderr, "usage: ratchet dlq ls|replay [flags]  (ratchet dlq <subcommand> -h for its flags)")
		return flag.ErrHelp
	}
	return usagef("dlq: a subcommand is required: ls or replay")
}

// deadLetter is one record of a dead-letter topic with its ratchet.*
// headers parsed.
type deadLetter struct {
	DLQTopic     string
	DLQPartition int32
	DLQOffset    int64
	Key, Value   []byte
	Headers      []kafka.Header // the original record's
	Timestamp    time.Time
	Topic        string
	Partition    int32
	Offset       int64
	Reason       string
	// Class, Pipeline and SQLState are the ratchet.reason,
	// ratchet.pipeline and ratchet.sqlstate headers; Class is empty on a
	// dead letter written before they existed.
	Class, Pipeline, SQLState string
	FailedAt                  time.Time
	// Unreadable says why the ratchet.* headers cannot be used ("" when
	// they can); such a record is never replayed.
	Unreadable string
}

func (d *deadLetter) where() string {
	return fmt.Sprintf("%s/%d/%d", d.DLQTopic, d.DLQPartition, d.DLQOffset)
}

func parseDeadLetter(m *kafka.Message) deadLetter {
	d := deadLetter{DLQTopic: *m.TopicPartition.Topic, DLQPartition: m.TopicPartition.Partition,
		DLQOffset: int64(m.TopicPartition.Offset), Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
	h := map[string]string{}
	for _, x := range m.Headers {
		if slices.Contains(dlqHeaders, x.Key) {
			h[x.Key] = string(x.Value)
			continue
		}
		d.Headers = append(d.Headers, x)
	}
	d.Topic, d.Reason = h[actors.HeaderTopic], h[actors.HeaderError]
	d.Class, d.Pipeline, d.SQLState = h[actors.HeaderReason], h[actors.HeaderPipeline], h[actors.HeaderSQLState]
	var problems []string
	if d.Topic == "" {
		problems = append(problems, "no "+actors.HeaderTopic)
	}
	if p, err := strconv.ParseInt(h[actors.HeaderPartition], 10, 32); err != nil || p < 0 {
		problems = append(problems, "bad "+actors.HeaderPartition)
	} else {
		d.Partition = int32(p)
	}
	if o, err := strconv.ParseInt(h[actors.HeaderOffset], 10, 64); err != nil || o < 0 {
		problems = append(problems, "bad "+actors.HeaderOffset)
	} else {
		d.Offset = o
	}
	if t, err := time.Parse(time.RFC3339Nano, h[actors.HeaderFailedAt]); err != nil {
		problems = append(problems, "bad "+actors.HeaderFailedAt)
	} else {
		d.FailedAt = t.UTC()
	}
	d.Unreadable = strings.Join(problems, ", ")
	return d
}

// dlqTopics returns the dead-letter topics to read: --topic, or every input
// topic's (kafka.dlq_topic), each once.
func dlqTopics(cfg config.Config, topic string) []string {
	if topic != "" {
		return []string{topic}
	}
	var out []string
	for _, t := range cfg.Kafka.Topics {
		if d := cfg.Kafka.DLQTopic(t); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// partitionEnds is where reading a partition ends: stable is its last
// stable offset, the end of what a read_committed consumer can read now
// (the high watermark unless a transaction is open), high its high
// watermark, low its first offset.
type partitionEnds struct{ low, stable, high int64 }

// hidden reports whether offsets past stable exist that cannot be read
// yet: an open transaction holds them back.
func (e partitionEnds) hidden() bool { return e.stable < e.high }

// ends asks the partition's leader for its earliest offset, last stable
// offset and high watermark.
func (k *kafkaTool) ends(ctx context.Context, topic string, partition int32) (partitionEnds, error) {
	ask := func(spec kafka.OffsetSpec, level kafka.IsolationLevel) (int64, error) {
		t := topic
		res, err := k.a.ListOffsets(ctx, map[kafka.TopicPartition]kafka.OffsetSpec{{Topic: &t, Partition: partition}: spec},
			kafka.SetAdminIsolationLevel(level), kafka.SetAdminRequestTimeout(kafkaTimeoutMs*time.Millisecond))
		if err != nil {
			return 0, err
		}
		for tp, r := range res.ResultInfos {
			if tp.Topic == nil || *tp.Topic != topic || tp.Partition != partition {
				continue
			}
			if r.Error.Code() != kafka.ErrNoError {
				return 0, r.Error
			}
			return int64(r.Offset), nil
		}
		return 0, errors.New("no answer for the partition")
	}
	var e partitionEnds
	var err error
	if e.low, err = ask(kafka.EarliestOffsetSpec, kafka.IsolationLevelReadUncommitted); err == nil {
		if e.stable, err = ask(kafka.LatestOffsetSpec, kafka.IsolationLevelReadCommitted); err == nil {
			e.high, err = ask(kafka.LatestOffsetSpec, kafka.IsolationLevelReadUncommitted)
		}
	}
	if err != nil {
		return e, fmt.Errorf("offsets of %s[%d]: %w", topic, partition, err)
	}
	return e, nil
}

// readPartition reads topic[partition] from from up to its last stable
// offset now, and calls fn for each record; it returns the ends it read
// up to. Records produced meanwhile are not read: the command works on a
// snapshot.
//
// It ends by the consumer's position, never by the offset of the last
// record it saw: offsets without a record to deliver (transaction markers,
// aborted transactions, compacted records) count as read once the consumer
// is past them, which librdkafka reports with a partition EOF at the
// position it reached. Offsets at or past the last stable offset (an open
// transaction upstream, and everything after it) are not readable yet;
// the caller sees that in the returned ends and must not treat them as
// "not there".
func (k *kafkaTool) readPartition(ctx context.Context, topic string, partition int32, from int64, fn func(*kafka.Message) error) (partitionEnds, error) {
	e, err := k.ends(ctx, topic, partition)
	if err != nil {
		return e, err
	}
	from = max(from, e.low)
	end := e.stable
	if from >= end {
		return e, nil
	}
	t := topic
	if err := k.c.Assign([]kafka.TopicPartition{{Topic: &t, Partition: partition, Offset: kafka.Offset(from)}}); err != nil {
		return e, fmt.Errorf("read %s[%d]: %w", topic, partition, err)
	}
	defer func() { _ = k.c.Unassign() }()
	at := from
	for at < end {
		if err := ctx.Err(); err != nil {
			return e, fmt.Errorf("read %s[%d] at %d of %d: %w", topic, partition, at, end, err)
		}
		switch m := k.c.Poll(200).(type) {
		case *kafka.Message:
			if m.TopicPartition.Error != nil {
				return e, fmt.Errorf("read %s[%d]: %w", topic, partition, m.TopicPartition.Error)
			}
			off := int64(m.TopicPartition.Offset)
			if off >= end {
				return e, nil // produced after the snapshot
			}
			at = off + 1
			if err := fn(m); err != nil {
				return e, err
			}
		case kafka.PartitionEOF:
			if m.Topic != nil && *m.Topic == topic && m.Partition == partition {
				at = max(at, int64(m.Offset))
			}
		case kafka.Error:
			if m.IsFatal() {
				return e, fmt.Errorf("read %s[%d]: %w", topic, partition, m)
			}
		case nil:
			// Nothing for a while: the position may have passed offsets
			// without records (markers, aborted batches).
			ps, err := k.c.Position([]kafka.TopicPartition{{Topic: &t, Partition: partition}})
			if err == nil && len(ps) == 1 && ps[0].Offset >= 0 {
				at = max(at, int64(ps[0].Offset))
			}
		}
	}
	return e, nil
}

// hiddenNote tells the user that offsets of a partition are held back by
// an open transaction.
func hiddenNote(topic string, partition int32, e partitionEnds) string {
	return fmt.Sprintf("%s[%d]: offsets %d..%d are behind an open transaction and not readable yet; a later run reads them",
		topic, partition, e.stable, e.high-1)
}

// readDeadLetters reads every record of a dead-letter topic as it is now.
// notes say which partitions have offsets not readable yet.
func (k *kafkaTool) readDeadLetters(ctx context.Context, topic string, parts []int32) (letters []deadLetter, notes []string, err error) {
	for _, p := range parts {
		e, err := k.readPartition(ctx, topic, p, 0, func(m *kafka.Message) error {
			letters = append(letters, parseDeadLetter(m))
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
		if e.hidden() {
			notes = append(notes, hiddenNote(topic, p, e))
		}
	}
	return letters, notes, nil
}

// dlqSource returns the dead-letter topics to read (--topic, which must
// exist, or every input topic's) and the partitions of every topic in the
// cluster.
func dlqSource(cfg config.Config, k *kafkaTool, topicFlag string) ([]string, map[string][]int32, error) {
	all, err := k.topics()
	if err != nil {
		return nil, nil, err
	}
	if topicFlag != "" {
		if _, ok := all[topicFlag]; !ok {
			return nil, nil, usagef("dlq: --topic %q does not exist in Kafka", topicFlag)
		}
	}
	return dlqTopics(cfg, topicFlag), all, nil
}

func dlqLsCmd(ctx context.Context, e *env, args []string) error {
	fs := flags(e, "dlq ls")
	path := fs.String("config", "", "YAML configuration file (environment variables RATCHET_* win)")
	topic := fs.String("topic", "", "dead-letter topic (default: every input topic's, from kafka.dlq_topic)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	k, err := openKafka(cfg, cfg.Kafka.GroupID)
	if err != nil {
		return err
	}
	defer k.Close()
	topics, all, err := dlqSource(cfg, k, *topic)
	if err != nil {
		return err
	}
	for i, t := range topics {
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		parts, ok := all[t]
		if !ok {
			fmt.Fprintf(e.stdout, "%s: no such topic (no dead letters yet)\n", t)
			continue
		}
		letters, notes, err := k.readDeadLetters(ctx, t, parts)
		if err != nil {
			return err
		}
		writeDLQSummary(e.stdout, t, letters, cfg.Log.IncludeValues)
		for _, n := range notes {
			fmt.Fprintln(e.stdout, n)
		}
	}
	return nil
}

// dlqGroupKey is what `dlq ls` groups dead letters by.
type dlqGroupKey struct {
	topic, pipeline, class, sqlstate string
	// legacy is the reason without its addresses, for a dead letter
	// without a ratchet.reason header (written by an older ratchet).
	legacy string
}

// dlqGroup is the dead letters of one group.
type dlqGroup struct {
	n           int
	first, last time.Time
	offsets     map[int32]*[2]int64 // per source partition, lowest and highest offset
	example     *deadLetter         // the lowest partition and offset
}

// writeDLQSummary prints the dead letters of topic grouped by source
// topic, pipeline, reason class and SQLSTATE, each group with its count,
// its offsets per source partition, the first and last failure and one
// example's reason (its record values replaced unless includeValues).
func writeDLQSummary(w io.Writer, topic string, letters []deadLetter, includeValues bool) {
	groups := map[dlqGroupKey]*dlqGroup{}
	unreadable := 0
	for i := range letters {
		d := &letters[i]
		if d.Unreadable != "" {
			unreadable++
			continue
		}
		k := dlqGroupKey{topic: d.Topic, pipeline: d.Pipeline, class: d.Class, sqlstate: d.SQLState}
		if k.class == "" {
			k.legacy = reasonClass(d.Reason)
		}
		g := groups[k]
		if g == nil {
			g = &dlqGroup{first: d.FailedAt, last: d.FailedAt, offsets: map[int32]*[2]int64{}, example: d}
			groups[k] = g
		}
		g.n++
		if d.FailedAt.Before(g.first) {
			g.first = d.FailedAt
		}
		if d.FailedAt.After(g.last) {
			g.last = d.FailedAt
		}
		if r := g.offsets[d.Partition]; r == nil {
			g.offsets[d.Partition] = &[2]int64{d.Offset, d.Offset}
		} else {
			r[0], r[1] = min(r[0], d.Offset), max(r[1], d.Offset)
		}
		if e := g.example; d.Partition < e.Partition || d.Partition == e.Partition && d.Offset < e.Offset {
			g.example = d
		}
	}
	keys := slices.Collect(maps.Keys(groups))
	slices.SortFunc(keys, func(a, b dlqGroupKey) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.pipeline, b.pipeline), cmp.Compare(a.class, b.class),
			cmp.Compare(a.sqlstate, b.sqlstate), cmp.Compare(a.legacy, b.legacy))
	})
	fmt.Fprintf(w, "%s: %d dead letters\n", topic, len(letters))
	if len(keys) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPIPELINE\tREASON\tSQLSTATE\tCOUNT\tOFFSETS\tFIRST FAILED_AT\tLAST FAILED_AT\tEXAMPLE")
		for _, k := range keys {
			g := groups[k]
			parts := slices.Sorted(maps.Keys(g.offsets))
			offs := make([]string, len(parts))
			for i, p := range parts {
				offs[i] = fmt.Sprintf("%d:%d..%d", p, g.offsets[p][0], g.offsets[p][1])
			}
			class := cmp.Or(k.class, "-") // an older ratchet's: the example says why
			text := oneLine(g.example.Reason)
			if !includeValues {
				text = redact.Values(text)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s[%d]@%d: %s\n", k.topic, cmp.Or(k.pipeline, "-"), class,
				cmp.Or(k.sqlstate, "-"), g.n, strings.Join(offs, ","), g.first.Format(time.RFC3339), g.last.Format(time.RFC3339),
				k.topic, g.example.Partition, g.example.Offset, text)
		}
		_ = tw.Flush()
	}
	if unreadable > 0 {
		fmt.Fprintf(w, "%d records without readable ratchet.* headers (not written by ratchet?)\n", unreadable)
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// reasonClass is the reason of a dead letter without ratchet.reason as
// `dlq ls` groups it: without the addresses of its batch and record.
func reasonClass(reason string) string { return redact.Addresses(oneLine(reason)) }

// replayOptions is a parsed `ratchet dlq replay` command line.
type replayOptions struct {
	tracer     *tracing.Tracer // --execute with tracing.enabled; nil: no spans
	config     string
	topic      string
	toTopic    string // "": each dead letter's source topic
	reason     *regexp.Regexp
	since      time.Time // zero: no bound
	until      time.Time // zero: no bound
	partitions []int32   // source partitions; nil: all
	execute    bool
}

func parseReplayArgs(e *env, args []string) (replayOptions, error) {
	var o replayOptions
	fs := flags(e, "dlq replay")
	fs.StringVar(&o.config, "config", "", "YAML configuration file (environment variables RATCHET_* win)")
	fs.StringVar(&o.topic, "topic", "", "dead-letter topic (default: every input topic's, from kafka.dlq_topic)")
	fs.StringVar(&o.toTopic, "to-topic", "", "produce the replays to this `TOPIC` (same partition number, modulo its partitions) instead of each dead letter's source topic")
	reason := fs.String("reason", "", "only dead letters whose ratchet.error matches this `REGEX`")
	since := fs.String("since", "", "only dead letters with ratchet.failed_at at or after this `RFC3339` time")
	until := fs.String("until", "", "only dead letters with ratchet.failed_at before this `RFC3339` time")
	parts := fs.String("partitions", "", "only dead letters of these source partitions (ratchet.partition), comma-separated")
	fs.BoolVar(&o.execute, "execute", false, "replay (without it nothing is produced or recorded)")
	if err := parse(fs, args); err != nil {
		return o, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["topic"] && strings.TrimSpace(o.topic) == "" {
		return o, usagef("dlq replay: --topic must not be empty")
	}
	if set["to-topic"] && strings.TrimSpace(o.toTopic) == "" {
		return o, usagef("dlq replay: --to-topic must not be empty")
	}
	if set["reason"] {
		re, err := regexp.Compile(*reason)
		if err != nil {
			return o, usagef("dlq replay: --reason %q is not a regular expression: %v", *reason, err)
		}
		o.reason = re
	}
	for _, f := range []struct {
		name string
		s    *string
		t    *time.Time
	}{{"since", since, &o.since}, {"until", until, &o.until}} {
		if !set[f.name] {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(*f.s))
		if err != nil {
			return o, usagef("dlq replay: --%s %q is not an RFC 3339 time (e.g. 2026-12-03T14:00:00Z)", f.name, *f.s)
		}
		*f.t = t
	}
	if !o.since.IsZero() && !o.until.IsZero() && !o.until.After(o.since) {
		return o, usagef("dlq replay: --until %s is not after --since %s", *until, *since)
	}
	if set["partitions"] {
		ps, err := parsePartitions(*parts)
		if err != nil {
			return o, usagef("dlq replay: --partitions %q: %v", *parts, err)
		}
		o.partitions = ps
	}
	return o, nil
}

// selects reports whether the filters select d.
func (o replayOptions) selects(d *deadLetter) bool {
	switch {
	case o.reason != nil && !o.reason.MatchString(d.Reason):
		return false
	case !o.since.IsZero() && d.FailedAt.Before(o.since):
		return false
	case !o.until.IsZero() && !d.FailedAt.Before(o.until):
		return false
	case o.partitions != nil && !slices.Contains(o.partitions, d.Partition):
		return false
	}
	return true
}

// replayCounts is what a replay run did (or, dry, would do).
type replayCounts struct {
	replayed, already, filtered, unreadable int
	// duplicates are dead letters of a source record that another dead
	// letter was (or is being) replayed for.
	duplicates int
	// Pending rows of an interrupted run: found delivered (recorded done,
	// and counted in already), not delivered (replayed again, counted in
	// replayed), and unresolved (left pending: their search could not
	// reach the end of the partition, or their dead letter is gone).
	found, lost, unresolved int
}

func dlqReplayCmd(ctx context.Context, e *env, args []string) error {
	o, err := parseReplayArgs(e, args)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(e, o.config)
	if err != nil {
		return err
	}
	if o.execute {
		tracer, stop, err := startTracer(e, cfg, newLogger(e.stderr, cfg, false))
		if err != nil {
			return err
		}
		defer stop()
		o.tracer = tracer
	}
	_, err = replay(ctx, e.stdout, cfg, o, nil)
	return err
}

// errInterrupted ends a replay run that a test stopped half-way.
var errInterrupted = errors.New("replay interrupted")

// errUnresolved ends a run that left pending replays it could not resolve.
var errUnresolved = errors.New("some pending replays could not be resolved; run again later")

// replay runs `ratchet dlq replay`. interrupt, when set, is asked after
// each delivery report and before it is recorded; true ends the run there,
// as a kill at the worst moment would (tests).
func replay(ctx context.Context, w io.Writer, cfg config.Config, o replayOptions, interrupt func() bool) (n replayCounts, runErr error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	k, err := openKafka(cfg, cfg.Kafka.GroupID)
	if err != nil {
		return n, err
	}
	defer k.Close()
	topics, all, err := dlqSource(cfg, k, o.topic)
	if err != nil {
		return n, err
	}
	if o.toTopic != "" {
		if _, ok := all[o.toTopic]; !ok {
			return n, usagef("dlq replay: --to-topic %q does not exist in Kafka", o.toTopic)
		}
	}
	pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), 2)
	if err != nil {
		return n, err
	}
	defer pool.Close()
	if o.execute {
		// ratchet_replays may be newer than the running engine's schema.
		if err := store.Migrate(ctx, pool); err != nil {
			return n, err
		}
	}
	var p *kafka.Producer
	if o.execute {
		m := kafkaclient.ProducerConfig(cfg.Kafka.Brokers, cfg.Kafka.Properties)
		_ = m.SetKey("go.logs.channel.enable", false)
		_ = m.SetKey("log_level", 3)
		if p, err = kafka.NewProducer(m); err != nil {
			return n, fmt.Errorf("new kafka producer: %w", err)
		}
		defer p.Close()
	}
	r := &replayer{w: w, k: k, p: p, pool: pool, all: all, o: o, group: cfg.Kafka.GroupID, n: &n, interrupt: interrupt,
		tracer: o.tracer}
	if o.execute {
		r.run = o.tracer.Start("dlq replay", tracing.Ref{})
		defer func() { r.run.End(runErr) }() // a run that failed is an error span
	}
	for _, t := range topics {
		parts, ok := all[t]
		if !ok {
			fmt.Fprintf(w, "%s: no such topic (no dead letters yet)\n", t)
			continue
		}
		if err := r.topic(ctx, t, parts); err != nil {
			writeReplayCounts(w, o, n)
			return n, err
		}
	}
	writeReplayCounts(w, o, n)
	if n.unresolved > 0 {
		return n, errUnresolved
	}
	return n, nil
}

func writeReplayCounts(w io.Writer, o replayOptions, n replayCounts) {
	verb := "replayed"
	if !o.execute {
		verb = "would replay"
	}
	fmt.Fprintf(w, "%s %d, skipped %d already replayed, filtered out %d", verb, n.replayed, n.already, n.filtered)
	if n.duplicates > 0 {
		fmt.Fprintf(w, ", skipped %s of a record replayed once", plural(n.duplicates, "duplicate dead letter"))
	}
	if n.unreadable > 0 {
		fmt.Fprintf(w, ", unreadable %d", n.unreadable)
	}
	if n.found+n.lost+n.unresolved > 0 {
		fmt.Fprintf(w, "; pending from an interrupted run: %d delivered, %d not delivered (replayed again), %d left pending",
			n.found, n.lost, n.unresolved)
	}
	fmt.Fprintln(w)
	if !o.execute {
		fmt.Fprintln(w, "dry run: nothing produced or recorded. Add --execute to replay.")
	}
}

// replayChunk is how many dead letters are recorded pending, produced and
// waited for at a time: a run stopped half-way leaves at most this many
// to be searched for by the next.
var replayChunk = 500

// replayStopped, when set (tests), is called when a chunk ends with an
// error: the run has then stopped producing and purged what it had not
// sent, though closing the producer and the rest may take a moment more.
var replayStopped func(error)

// sourceKey names a dead letter's original record.
type sourceKey struct {
	topic     string
	partition int32
	offset    int64
}

type replayKey struct {
	partition int32
	offset    int64
}

// replayer is one `dlq replay` run.
type replayer struct {
	w         io.Writer
	k         *kafkaTool
	p         *kafka.Producer // nil in a dry run
	pool      *pgxpool.Pool
	all       map[string][]int32
	o         replayOptions
	group     string
	n         *replayCounts
	interrupt func() bool
	// lease is the held lease of the dead-letter topic being replayed
	// (--execute; nil in a dry run): nothing is produced or recorded once
	// it is lost.
	lease *store.ReplayLease
	// tracer sends each replayed record under a span linking to its dead
	// letter's context, children of run; nil: no spans.
	tracer *tracing.Tracer
	run    tracing.Span
}

// replayPlan is what a run does to one dead-letter topic; a dry run
// prints it, --execute carries it out. Both make it the same way, so a
// dry run reports what --execute would do.
type replayPlan struct {
	found []store.Replay // pending rows whose record is in Kafka: record them done
	dups  []store.Replay // dead letters to record as duplicates
	todo  []*deadLetter  // to produce (new, or pending and not delivered)
}

// target is the topic and partition d is replayed to.
func (r *replayer) target(d *deadLetter) (string, int32) {
	if r.o.toTopic == "" {
		return d.Topic, d.Partition
	}
	ps := r.all[r.o.toTopic]
	if slices.Contains(ps, d.Partition) {
		return r.o.toTopic, d.Partition
	}
	return r.o.toTopic, ps[int(d.Partition)%len(ps)]
}

func (r *replayer) row(d *deadLetter) store.Replay {
	t, p := r.target(d)
	return store.Replay{DLQTopic: d.DLQTopic, DLQPartition: d.DLQPartition, DLQOffset: d.DLQOffset,
		Topic: d.Topic, Partition: d.Partition, SourceOffset: d.Offset, ToTopic: t, ToPartition: p, Group: r.group}
}

// leaseOwner names this run in ratchet_replay_leases.
func leaseOwner() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}

func (r *replayer) topic(ctx context.Context, dlqTopic string, parts []int32) error {
	if r.o.execute {
		lease, err := store.LockReplays(ctx, r.pool, dlqTopic, leaseOwner())
		if err != nil {
			return err
		}
		r.lease = lease
		defer func() { _ = lease.Release(ctx); r.lease = nil }()
		// A run that loses its lease (it could not renew it before its own
		// deadline, or it was taken) stops at once: every wait below is
		// bounded by ctx, which ends then, before another run can take
		// the lease.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		watched := make(chan struct{})
		defer func() { cancel(nil); <-watched }()
		go func() { // ends with the lease lost, or with this topic's run
			defer close(watched)
			select {
			case <-lease.Lost():
				cancel(lease.Err())
			case <-ctx.Done():
			}
		}()
	}
	plan, err := r.plan(ctx, dlqTopic, parts)
	if err != nil {
		return err
	}
	if !r.o.execute {
		for _, d := range plan.todo {
			t, p := r.target(d)
			fmt.Fprintf(r.w, "would replay %s to %s[%d] (offset %d, failed %s): %s\n", d.where(), t, p,
				d.Offset, d.FailedAt.Format(time.RFC3339), oneLine(d.Reason))
		}
		r.n.replayed += len(plan.todo)
		return nil
	}
	for _, f := range plan.found {
		if err := store.MarkReplayDone(ctx, r.pool, f.DLQTopic, f.DLQPartition, f.DLQOffset, f.ReplayedOffset); err != nil {
			return err
		}
	}
	if err := store.MarkReplayDuplicates(ctx, r.pool, plan.dups); err != nil {
		return err
	}
	todo := plan.todo
	for len(todo) > 0 {
		c := todo[:min(replayChunk, len(todo))]
		todo = todo[len(c):]
		if err := r.letters(ctx, c); err != nil {
			if replayStopped != nil {
				replayStopped(err)
			}
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(err, cause) {
				return fmt.Errorf("%w (%w)", err, cause)
			}
			return err
		}
	}
	return nil
}

// plan reads the dead letters of dlqTopic and its ratchet_replays rows and
// decides what to do with each dead letter. Idempotency is keyed by the
// dead letter itself (its partition and offset in dlqTopic): a dead letter
// with a row is never produced again, except a pending one whose record is
// not in Kafka; a dead letter without one is produced, except when another
// dead letter of the same source record is replayed in this run (the DLQ is
// at-least-once: it is recorded as a duplicate) or was replayed, by a run
// before duplicates were recorded, after it failed. A genuinely new dead
// letter of a record replayed before (the record failed again after an
// `offsets reset`) is therefore replayed.
func (r *replayer) plan(ctx context.Context, dlqTopic string, parts []int32) (replayPlan, error) {
	var plan replayPlan
	letters, notes, err := r.k.readDeadLetters(ctx, dlqTopic, parts)
	if err != nil {
		return plan, err
	}
	for _, note := range notes {
		fmt.Fprintln(r.w, note)
	}
	rows, err := store.Replays(ctx, r.pool, dlqTopic)
	var pgErr *pgconn.PgError
	if err != nil && !r.o.execute && errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703") {
		// A dry run against a schema without ratchet_replays (or before
		// migration 005): nothing replayed yet, or only legacy rows,
		// which --execute migrates first.
		rows, err = legacyReplays(ctx, r.pool, dlqTopic)
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			rows, err = nil, nil
		}
	}
	if err != nil {
		return plan, err
	}
	byKey := map[replayKey]*store.Replay{}
	var pending []store.Replay
	for i := range rows {
		byKey[replayKey{rows[i].DLQPartition, rows[i].DLQOffset}] = &rows[i]
		if rows[i].State == store.ReplayPending {
			pending = append(pending, rows[i])
		}
	}
	found, searched, err := r.searchPending(ctx, pending)
	if err != nil {
		return plan, err
	}
	for _, f := range found {
		fmt.Fprintf(r.w, "found %s/%d/%d already replayed to %s[%d] at %d by an interrupted run\n",
			f.DLQTopic, f.DLQPartition, f.DLQOffset, f.ToTopic, f.ToPartition, f.ReplayedOffset)
	}
	plan.found = found
	isFound := map[replayKey]bool{}
	for _, f := range found {
		isFound[replayKey{f.DLQPartition, f.DLQOffset}] = true
	}
	// Legacy done rows: their run skipped the duplicates it saw without
	// recording them; a dead letter of the same record that failed before
	// the row was done was one of them.
	legacy := map[sourceKey]time.Time{}
	for _, x := range rows {
		if x.Legacy && x.State == store.ReplayDone {
			k := sourceKey{x.Topic, x.Partition, x.SourceOffset}
			if x.UpdatedAt.After(legacy[k]) {
				legacy[k] = x.UpdatedAt
			}
		}
	}
	present := map[replayKey]bool{}
	sources := map[sourceKey]bool{}
	var fresh []*deadLetter
	// First the dead letters with a row, so that a pending replay (which
	// may be in Kafka) claims its source record before any new dead letter.
	for i := range letters {
		d := &letters[i]
		key := replayKey{d.DLQPartition, d.DLQOffset}
		present[key] = true
		row := byKey[key]
		switch {
		case d.Unreadable != "":
			r.n.unreadable++
		case row == nil:
			fresh = append(fresh, d)
		case row.State == store.ReplayDone:
			r.n.already++
		case row.State == store.ReplayDuplicate:
			r.n.duplicates++
		case isFound[key]:
			r.n.already++
			r.n.found++
			sources[sourceKey{d.Topic, d.Partition, d.Offset}] = true
		case !searched[key]:
			r.n.unresolved++
			sources[sourceKey{d.Topic, d.Partition, d.Offset}] = true
			fmt.Fprintf(r.w, "left %s pending: its replay may be in %s[%d] past offsets not readable yet\n",
				d.where(), row.ToTopic, row.ToPartition)
		default: // pending, searched for and not in Kafka: never delivered
			r.n.lost++
			sources[sourceKey{d.Topic, d.Partition, d.Offset}] = true
			plan.todo = append(plan.todo, d)
		}
	}
	for _, x := range pending {
		key := replayKey{x.DLQPartition, x.DLQOffset}
		if !present[key] && !isFound[key] {
			r.n.unresolved++
			fmt.Fprintf(r.w, "left %s/%d/%d pending: not found in %s[%d], and the dead letter is no longer in %s\n",
				x.DLQTopic, x.DLQPartition, x.DLQOffset, x.ToTopic, x.ToPartition, dlqTopic)
		}
	}
	for _, d := range fresh {
		src := sourceKey{d.Topic, d.Partition, d.Offset}
		at, replayedBefore := legacy[src]
		switch {
		case !r.o.selects(d):
			r.n.filtered++
		case sources[src] || (replayedBefore && !d.FailedAt.After(at)):
			r.n.duplicates++
			plan.dups = append(plan.dups, r.row(d))
		case !slices.Contains(r.all[d.Topic], d.Partition):
			r.n.unreadable++
			fmt.Fprintf(r.w, "cannot replay %s: source %s[%d] does not exist\n", d.where(), d.Topic, d.Partition)
		default:
			sources[src] = true
			plan.todo = append(plan.todo, d)
		}
	}
	slices.SortFunc(plan.todo, func(a, b *deadLetter) int {
		if a.DLQPartition != b.DLQPartition {
			return int(a.DLQPartition - b.DLQPartition)
		}
		return int(a.DLQOffset - b.DLQOffset)
	})
	return plan, nil
}

// legacyReplays reads ratchet_replays as it was before migration 005 (a
// dry run does not migrate): every row is legacy.
func legacyReplays(ctx context.Context, pool *pgxpool.Pool, dlqTopic string) ([]store.Replay, error) {
	rows, err := pool.Query(ctx, `
SELECT dlq_partition, dlq_offset, topic, partition, source_offset, state, search_from, coalesce(replayed_offset, -1), updated_at
FROM ratchet_replays WHERE dlq_topic = $1`, dlqTopic)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Replay, error) {
		x := store.Replay{DLQTopic: dlqTopic, Legacy: true}
		err := row.Scan(&x.DLQPartition, &x.DLQOffset, &x.Topic, &x.Partition, &x.SourceOffset, &x.State, &x.SearchFrom,
			&x.ReplayedOffset, &x.UpdatedAt)
		x.ToTopic, x.ToPartition = x.Topic, x.Partition
		return x, err
	})
}

// held returns nil while this run may produce and record: in a dry run,
// or while the lease is held; otherwise why not.
func (r *replayer) held(ctx context.Context) error {
	if r.lease != nil {
		if err := r.lease.Err(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	return nil
}

// letters replays letters: records them as pending with where a search
// for them would start, produces them, and records each as done after its
// delivery report.
//
// Every wait in it ends with ctx, which the lease's loss ends. A run that
// stops with records still queued in the producer purges them, so none
// is sent after it stopped (a record already on the wire may still land:
// the lease's margin is for it, and the next run finds it by its
// ratchet.replayed_from). Once the lease is lost no delivery report is
// recorded or counted: those rows stay pending, and the next run searches
// for them.
func (r *replayer) letters(ctx context.Context, letters []*deadLetter) error {
	type tp struct {
		topic string
		part  int32
	}
	ends := map[tp]int64{}
	rs := make([]store.Replay, len(letters))
	for i, d := range letters {
		rs[i] = r.row(d)
		key := tp{rs[i].ToTopic, rs[i].ToPartition}
		end, ok := ends[key]
		if !ok {
			// The high watermark, not the last stable offset: the record
			// lands at or after it.
			e, err := r.k.ends(ctx, key.topic, key.part)
			if err != nil {
				return err
			}
			end, ends[key] = e.high, e.high
		}
		rs[i].SearchFrom = end
	}
	if err := store.MarkReplaysPending(ctx, r.pool, rs, nil); err != nil {
		return err
	}
	deliveries := make(chan kafka.Event, len(letters)) // room for every report: librdkafka never blocks on it
	spans := map[*deadLetter]tracing.Send{}
	outstanding := 0 // produced, no delivery report read yet
	defer func() {
		if outstanding > 0 {
			// Stopped before every report: nothing still queued may be
			// sent after this run stopped.
			_ = r.p.Purge(kafka.PurgeQueue | kafka.PurgeInFlight | kafka.PurgeNonBlocking)
		}
		for _, s := range spans {
			s.End(errors.New("no delivery report"))
		}
	}()
	for i, d := range letters {
		t := rs[i].ToTopic
		headers := append(slices.Clip(d.Headers), kafka.Header{Key: HeaderReplayedFrom, Value: []byte(d.where())},
			kafka.Header{Key: actors.HeaderReplayGroup, Value: []byte(r.group)})
		if r.tracer != nil {
			// The replayed record's span links to the dead letter's (the
			// `send <dlq topic>` span of the batch that refused it), and
			// the record carries the replay's context from here on.
			s := r.tracer.StartSend(r.run.Ref(), t, d.Headers)
			s.String("ratchet.replayed_from", d.where())
			headers = s.Inject(headers)
			spans[d] = s
		}
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: rs[i].ToPartition},
			Key: d.Key, Value: d.Value, Headers: headers, Timestamp: d.Timestamp, Opaque: d}
		for {
			if err := r.held(ctx); err != nil {
				return fmt.Errorf("replay %s: stopped before producing it: %w (a rerun replays it)", d.where(), err)
			}
			err := r.p.Produce(m, deliveries)
			var ke kafka.Error
			if errors.As(err, &ke) && ke.Code() == kafka.ErrQueueFull {
				r.p.Flush(100) // at most 100 ms, then the lease is checked again
				continue
			}
			if err != nil {
				return fmt.Errorf("replay %s: %w", d.where(), err)
			}
			outstanding++
			break
		}
	}
	var errs []error
	for range letters {
		var ev kafka.Event
		select {
		case ev = <-deliveries:
			outstanding--
		case <-ctx.Done():
			return fmt.Errorf("replay: waiting for delivery reports: %w (a rerun finds what was delivered)", context.Cause(ctx))
		}
		m, ok := ev.(*kafka.Message)
		if !ok {
			continue
		}
		d := m.Opaque.(*deadLetter)
		if s, ok := spans[d]; ok {
			s.End(m.TopicPartition.Error)
			delete(spans, d)
		}
		if m.TopicPartition.Error != nil {
			errs = append(errs, fmt.Errorf("replay %s: %w", d.where(), m.TopicPartition.Error))
			continue
		}
		if r.interrupt != nil && r.interrupt() {
			return errInterrupted
		}
		if err := r.held(ctx); err != nil {
			// Delivered, but this run may no longer write: the row stays
			// pending and the next run finds the record.
			return fmt.Errorf("replay %s: delivered, not recorded: %w (a rerun finds it)", d.where(), err)
		}
		off := int64(m.TopicPartition.Offset)
		if err := store.MarkReplayDone(ctx, r.pool, d.DLQTopic, d.DLQPartition, d.DLQOffset, off); err != nil {
			return err
		}
		r.n.replayed++
		fmt.Fprintf(r.w, "replayed %s to %s[%d] at %d (original offset %d)\n", d.where(), *m.TopicPartition.Topic,
			m.TopicPartition.Partition, off, d.Offset)
	}
	return errors.Join(errs...)
}

// searchPending looks for the records of an interrupted run: for each
// pending replay it reads the partition it was produced to, from the row's
// SearchFrom, for a record whose ratchet.replayed_from names the dead
// letter. found are the rows whose record is there (ReplayedOffset set);
// searched are the rows whose whole range was read: not found there, the
// record was never delivered. A row whose range could not be read to the
// end (an open transaction holds back offsets, or the partition's start
// moved past SearchFrom) is in neither: it stays pending, since "not
// read" is not "not there". Nothing is written.
func (r *replayer) searchPending(ctx context.Context, pending []store.Replay) (found []store.Replay, searched map[replayKey]bool, err error) {
	searched = map[replayKey]bool{}
	if len(pending) == 0 {
		return nil, searched, nil
	}
	type tp struct {
		topic string
		part  int32
	}
	from := map[tp]int64{}
	want := map[string]*store.Replay{}
	for i := range pending {
		x := &pending[i]
		key := tp{x.ToTopic, x.ToPartition}
		if f, ok := from[key]; !ok || x.SearchFrom < f {
			from[key] = x.SearchFrom
		}
		want[fmt.Sprintf("%s/%d/%d", x.DLQTopic, x.DLQPartition, x.DLQOffset)] = x
	}
	for key, f := range from {
		e, err := r.k.readPartition(ctx, key.topic, key.part, f, func(m *kafka.Message) error {
			for _, h := range m.Headers {
				if h.Key != HeaderReplayedFrom {
					continue
				}
				x, ok := want[string(h.Value)]
				if !ok || x.ToTopic != key.topic || x.ToPartition != key.part {
					continue
				}
				delete(want, string(h.Value))
				x.ReplayedOffset = int64(m.TopicPartition.Offset)
				found = append(found, *x)
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
		if e.hidden() {
			fmt.Fprintln(r.w, hiddenNote(key.topic, key.part, e))
		}
		for _, x := range want {
			if x.ToTopic == key.topic && x.ToPartition == key.part && !e.hidden() && e.low <= x.SearchFrom {
				searched[replayKey{x.DLQPartition, x.DLQOffset}] = true
			}
		}
	}
	for _, f := range found {
		searched[replayKey{f.DLQPartition, f.DLQOffset}] = true
	}
	return found, searched, nil
}
