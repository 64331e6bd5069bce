package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/store"
)

// HeaderReplayedFrom marks a record that `ratchet dlq replay` re-produced:
// "<dlq topic>/<partition>/<offset>" of the dead letter it came from. A
// rerun finds an interrupted run's records by it.
const HeaderReplayedFrom = "ratchet.replayed_from"

// dlqHeaders are the headers the DLQ actor adds; everything else on a dead
// letter is the original record's.
var dlqHeaders = []string{actors.HeaderError, actors.HeaderTopic, actors.HeaderPartition, actors.HeaderOffset,
	actors.HeaderAttempts, actors.HeaderFailedAt, HeaderReplayedFrom}

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
	FailedAt     time.Time
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

// readPartition reads topic[partition] from from up to the end offset it
// has now, and calls fn for each record. Records produced meanwhile are not
// read: the command works on a snapshot.
func (k *kafkaTool) readPartition(ctx context.Context, topic string, partition int32, from int64, fn func(*kafka.Message) error) error {
	low, high, err := k.c.QueryWatermarkOffsets(topic, partition, kafkaTimeoutMs)
	if err != nil {
		return fmt.Errorf("watermarks of %s[%d]: %w", topic, partition, err)
	}
	from = max(from, low)
	if from >= high {
		return nil
	}
	t := topic
	if err := k.c.Assign([]kafka.TopicPartition{{Topic: &t, Partition: partition, Offset: kafka.Offset(from)}}); err != nil {
		return fmt.Errorf("read %s[%d]: %w", topic, partition, err)
	}
	defer func() { _ = k.c.Unassign() }()
	next := from
	for next < high {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s[%d] at %d of %d: %w", topic, partition, next, high, err)
		}
		ev := k.c.Poll(200)
		switch m := ev.(type) {
		case *kafka.Message:
			if m.TopicPartition.Error != nil {
				return fmt.Errorf("read %s[%d]: %w", topic, partition, m.TopicPartition.Error)
			}
			next = int64(m.TopicPartition.Offset) + 1
			if err := fn(m); err != nil {
				return err
			}
		case kafka.Error:
			if m.IsFatal() {
				return fmt.Errorf("read %s[%d]: %w", topic, partition, m)
			}
		}
	}
	return nil
}

// readDeadLetters reads every record of a dead-letter topic as it is now.
func (k *kafkaTool) readDeadLetters(ctx context.Context, topic string, parts []int32) ([]deadLetter, error) {
	var out []deadLetter
	for _, p := range parts {
		err := k.readPartition(ctx, topic, p, 0, func(m *kafka.Message) error {
			out = append(out, parseDeadLetter(m))
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
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
		letters, err := k.readDeadLetters(ctx, t, parts)
		if err != nil {
			return err
		}
		writeDLQSummary(e.stdout, t, letters)
	}
	return nil
}

func writeDLQSummary(w io.Writer, topic string, letters []deadLetter) {
	type key struct {
		topic     string
		partition int32
		reason    string
	}
	type agg struct {
		n           int
		first, last time.Time
	}
	groups := map[key]*agg{}
	unreadable := 0
	for _, d := range letters {
		if d.Unreadable != "" {
			unreadable++
			continue
		}
		k := key{d.Topic, d.Partition, reasonClass(d.Reason)}
		a := groups[k]
		if a == nil {
			a = &agg{first: d.FailedAt, last: d.FailedAt}
			groups[k] = a
		}
		a.n++
		if d.FailedAt.Before(a.first) {
			a.first = d.FailedAt
		}
		if d.FailedAt.After(a.last) {
			a.last = d.FailedAt
		}
	}
	keys := make([]key, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.topic != b.topic {
			return a.topic < b.topic
		}
		if a.partition != b.partition {
			return a.partition < b.partition
		}
		return a.reason < b.reason
	})
	fmt.Fprintf(w, "%s: %d dead letters\n", topic, len(letters))
	if len(keys) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tCOUNT\tFIRST FAILED_AT\tLAST FAILED_AT\tREASON")
		for _, k := range keys {
			a := groups[k]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", k.topic, k.partition, a.n,
				a.first.Format(time.RFC3339), a.last.Format(time.RFC3339), oneLine(k.reason))
		}
		_ = tw.Flush()
	}
	if unreadable > 0 {
		fmt.Fprintf(w, "%d records without readable ratchet.* headers (not written by ratchet?)\n", unreadable)
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// batchPrefix is how the engine prefixes an error of a batch it applied
// ("apply events[3] offsets 120..121: "): the offsets differ for every
// dead letter, so `dlq ls` groups reasons without it.
var batchPrefix = regexp.MustCompile(`^apply \S+\[\d+\] offsets \d+\.\.\d+: `)

// reasonClass is a dead letter's reason as `dlq ls` groups it.
func reasonClass(reason string) string { return batchPrefix.ReplaceAllString(oneLine(reason), "") }

// replayOptions is a parsed `ratchet dlq replay` command line.
type replayOptions struct {
	config     string
	topic      string
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

// replayCounts is what a replay run did.
type replayCounts struct {
	replayed, already, filtered, unreadable int
	// duplicates are dead letters of a source record that another dead
	// letter was (or is being) replayed for.
	duplicates int
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
	_, err = replay(ctx, e.stdout, cfg, o, nil)
	return err
}

// errInterrupted ends a replay run that a test stopped half-way.
var errInterrupted = errors.New("replay interrupted")

// replay runs `ratchet dlq replay`. interrupt, when set, is asked after
// each delivery report and before it is recorded; true ends the run there,
// as a kill at the worst moment would (tests).
func replay(ctx context.Context, w io.Writer, cfg config.Config, o replayOptions, interrupt func() bool) (replayCounts, error) {
	var n replayCounts
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
	for _, t := range topics {
		parts, ok := all[t]
		if !ok {
			fmt.Fprintf(w, "%s: no such topic (no dead letters yet)\n", t)
			continue
		}
		if err := replayTopic(ctx, w, k, p, pool, all, t, parts, o, &n, interrupt); err != nil {
			writeReplayCounts(w, o, n)
			return n, err
		}
	}
	writeReplayCounts(w, o, n)
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
	fmt.Fprintln(w)
	if !o.execute {
		fmt.Fprintln(w, "dry run: nothing produced or recorded. Add --execute to replay.")
	}
}

// replayChunk is how many dead letters are recorded pending, produced and
// waited for at a time: a run stopped half-way leaves at most this many
// to be searched for by the next.
var replayChunk = 500

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

func replayTopic(ctx context.Context, w io.Writer, k *kafkaTool, p *kafka.Producer, pool *pgxpool.Pool, all map[string][]int32,
	dlqTopic string, parts []int32, o replayOptions, n *replayCounts, interrupt func() bool) error {
	if o.execute {
		unlock, err := store.LockReplays(ctx, pool, dlqTopic)
		if err != nil {
			return err
		}
		defer unlock()
	}
	letters, err := k.readDeadLetters(ctx, dlqTopic, parts)
	if err != nil {
		return err
	}
	rows, err := store.Replays(ctx, pool, dlqTopic)
	var pgErr *pgconn.PgError
	if err != nil && !o.execute && errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		err = nil // a dry run against a schema without ratchet_replays: nothing replayed yet
	}
	if err != nil {
		return err
	}
	done := map[replayKey]bool{}
	// The DLQ is at-least-once (and a reset that replays a poison record
	// dead-letters it again): several dead letters can stand for the same
	// source record. Each source record is replayed at most once.
	sources := map[sourceKey]bool{}
	var pending []store.Replay
	for _, r := range rows {
		if r.State == store.ReplayDone {
			done[replayKey{r.DLQPartition, r.DLQOffset}] = true
			sources[sourceKey{r.Topic, r.Partition, r.SourceOffset}] = true
		} else {
			pending = append(pending, r)
		}
	}
	if o.execute && len(pending) > 0 {
		found, err := resolvePending(ctx, k, pool, dlqTopic, pending)
		if err != nil {
			return err
		}
		for _, r := range found {
			done[replayKey{r.DLQPartition, r.DLQOffset}] = true
			sources[sourceKey{r.Topic, r.Partition, r.SourceOffset}] = true
			fmt.Fprintf(w, "found %s/%d/%d already replayed to %s[%d] at %d by an interrupted run\n",
				r.DLQTopic, r.DLQPartition, r.DLQOffset, r.Topic, r.Partition, r.ReplayedOffset)
		}
	}
	var todo []*deadLetter
	for i := range letters {
		d := &letters[i]
		switch {
		case d.Unreadable != "":
			n.unreadable++
		case !o.selects(d):
			n.filtered++
		case done[replayKey{d.DLQPartition, d.DLQOffset}]:
			n.already++
		case sources[sourceKey{d.Topic, d.Partition, d.Offset}]:
			n.duplicates++
		case !slices.Contains(all[d.Topic], d.Partition):
			n.unreadable++
			fmt.Fprintf(w, "cannot replay %s: source %s[%d] does not exist\n", d.where(), d.Topic, d.Partition)
		default:
			sources[sourceKey{d.Topic, d.Partition, d.Offset}] = true
			todo = append(todo, d)
		}
	}
	if !o.execute {
		for _, d := range todo {
			fmt.Fprintf(w, "would replay %s to %s[%d] (offset %d, failed %s): %s\n", d.where(), d.Topic, d.Partition,
				d.Offset, d.FailedAt.Format(time.RFC3339), oneLine(d.Reason))
		}
		n.replayed += len(todo)
		return nil
	}
	for len(todo) > 0 {
		c := todo[:min(replayChunk, len(todo))]
		todo = todo[len(c):]
		if err := replayLetters(ctx, w, k, p, pool, c, n, interrupt); err != nil {
			return err
		}
	}
	return nil
}

// replayLetters replays letters: records them as pending with where a search
// for them would start, produces them to their source partitions, and
// records each as done after its delivery report.
func replayLetters(ctx context.Context, w io.Writer, k *kafkaTool, p *kafka.Producer, pool *pgxpool.Pool, letters []*deadLetter,
	n *replayCounts, interrupt func() bool) error {
	type tp struct {
		topic string
		part  int32
	}
	ends := map[tp]int64{}
	rs := make([]store.Replay, len(letters))
	for i, d := range letters {
		key := tp{d.Topic, d.Partition}
		end, ok := ends[key]
		if !ok {
			_, high, err := k.c.QueryWatermarkOffsets(d.Topic, d.Partition, kafkaTimeoutMs)
			if err != nil {
				return fmt.Errorf("watermarks of %s[%d]: %w", d.Topic, d.Partition, err)
			}
			end, ends[key] = high, high
		}
		rs[i] = store.Replay{DLQTopic: d.DLQTopic, DLQPartition: d.DLQPartition, DLQOffset: d.DLQOffset,
			Topic: d.Topic, Partition: d.Partition, SourceOffset: d.Offset, SearchFrom: end}
	}
	if err := store.MarkReplaysPending(ctx, pool, rs); err != nil {
		return err
	}
	deliveries := make(chan kafka.Event, len(letters))
	for _, d := range letters {
		t := d.Topic
		headers := append(slices.Clip(d.Headers), kafka.Header{Key: HeaderReplayedFrom, Value: []byte(d.where())})
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: d.Partition},
			Key: d.Key, Value: d.Value, Headers: headers, Timestamp: d.Timestamp, Opaque: d}
		for {
			err := p.Produce(m, deliveries)
			var ke kafka.Error
			if errors.As(err, &ke) && ke.Code() == kafka.ErrQueueFull {
				p.Flush(100)
				continue
			}
			if err != nil {
				return fmt.Errorf("replay %s: %w", d.where(), err)
			}
			break
		}
	}
	var errs []error
	for range letters {
		var ev kafka.Event
		select {
		case ev = <-deliveries:
		case <-ctx.Done():
			return fmt.Errorf("replay: waiting for delivery reports: %w (a rerun finds what was delivered)", ctx.Err())
		}
		m, ok := ev.(*kafka.Message)
		if !ok {
			continue
		}
		d := m.Opaque.(*deadLetter)
		if m.TopicPartition.Error != nil {
			errs = append(errs, fmt.Errorf("replay %s: %w", d.where(), m.TopicPartition.Error))
			continue
		}
		if interrupt != nil && interrupt() {
			return errInterrupted
		}
		off := int64(m.TopicPartition.Offset)
		if err := store.MarkReplayDone(ctx, pool, d.DLQTopic, d.DLQPartition, d.DLQOffset, off); err != nil {
			return err
		}
		n.replayed++
		fmt.Fprintf(w, "replayed %s to %s[%d] at %d (original offset %d)\n", d.where(), d.Topic, d.Partition, off, d.Offset)
	}
	return errors.Join(errs...)
}

// resolvePending looks for the records of an interrupted run: for each
// pending replay it searches its source partition from the row's
// SearchFrom for a record whose ratchet.replayed_from names the dead
// letter, and records the ones found as done. The others were never
// delivered and are replayed again.
func resolvePending(ctx context.Context, k *kafkaTool, pool *pgxpool.Pool, dlqTopic string, pending []store.Replay) ([]store.Replay, error) {
	type tp struct {
		topic string
		part  int32
	}
	from := map[tp]int64{}
	want := map[string]*store.Replay{}
	for i := range pending {
		r := &pending[i]
		key := tp{r.Topic, r.Partition}
		if f, ok := from[key]; !ok || r.SearchFrom < f {
			from[key] = r.SearchFrom
		}
		want[fmt.Sprintf("%s/%d/%d", r.DLQTopic, r.DLQPartition, r.DLQOffset)] = r
	}
	var found []store.Replay
	for key, f := range from {
		err := k.readPartition(ctx, key.topic, key.part, f, func(m *kafka.Message) error {
			for _, h := range m.Headers {
				if h.Key != HeaderReplayedFrom {
					continue
				}
				r, ok := want[string(h.Value)]
				if !ok || r.Topic != key.topic || r.Partition != key.part {
					continue
				}
				delete(want, string(h.Value))
				r.ReplayedOffset = int64(m.TopicPartition.Offset)
				if err := store.MarkReplayDone(ctx, pool, dlqTopic, r.DLQPartition, r.DLQOffset, r.ReplayedOffset); err != nil {
					return err
				}
				found = append(found, *r)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return found, nil
}
