package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/redact"
	"ratchet/internal/store"
	"ratchet/processor"
	"ratchet/processor/pipeline"
)

// backfillGroup is the group id of the backfill's consumer. It never
// joins the group or commits: partitions are assigned by hand.
const backfillGroup = "ratchet-pipelines-backfill"

// backfillProgressEvery is how often a running backfill prints a
// progress line (a variable so that tests can shorten it).
var backfillProgressEvery = 5 * time.Second

// backfillOptions are the flags of `ratchet pipelines backfill`.
type backfillOptions struct {
	name     string
	config   string
	earliest bool
	from     time.Time // zero: from the earliest offset
	execute  bool
	rate     float64 // records per second; 0: no limit
	metrics  string  // host:port to serve /metrics on while it runs; "": none
}

const backfillUsage = "usage: ratchet pipelines backfill NAME [--from-earliest | --from-datetime RFC3339] [--execute] [--rate N] [--metrics-addr HOST:PORT] [--config FILE]"

// parseBackfillArgs reads NAME and the flags, in either order.
func parseBackfillArgs(e *env, args []string) (backfillOptions, error) {
	var o backfillOptions
	fs := flags(e, "pipelines backfill")
	fs.StringVar(&o.config, "config", "", "YAML configuration file (pipelines, kafka, postgres.url)")
	fs.BoolVar(&o.earliest, "from-earliest", false, "start at the earliest offset still in the topic (the default)")
	from := fs.String("from-datetime", "", "start at the first record at or after this `RFC3339` time (by Kafka timestamp, per partition)")
	fs.BoolVar(&o.execute, "execute", false, "apply the backfill (without it: print the plan only)")
	fs.Float64Var(&o.rate, "rate", 0, "at most `N` records per second (0: no limit)")
	fs.StringVar(&o.metrics, "metrics-addr", "", "serve the run's Prometheus metrics on `HOST:PORT`/metrics while it runs (the live engine's /metrics shows the committed progress too)")
	var rest []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return o, err
			}
			return o, usagef("%v", err)
		}
		if fs.NArg() == 0 {
			break
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
	switch {
	case len(rest) == 0:
		return o, usagef("pipelines backfill: the pipeline's NAME is missing\n%s", backfillUsage)
	case len(rest) > 1:
		return o, usagef("pipelines backfill: unexpected argument %q (one pipeline at a time)", rest[1])
	case strings.TrimSpace(rest[0]) == "":
		return o, usagef("pipelines backfill: empty pipeline NAME")
	case o.earliest && *from != "":
		return o, usagef("pipelines backfill: --from-earliest and --from-datetime: choose one")
	case o.rate < 0 || o.rate != o.rate:
		return o, usagef("pipelines backfill: --rate %v: records per second, 0 (no limit) or more", o.rate)
	}
	o.name = rest[0]
	if *from != "" {
		t, err := time.Parse(time.RFC3339Nano, *from)
		if err != nil {
			return o, usagef("pipelines backfill: --from-datetime %q: an RFC 3339 time, e.g. 2026-12-01T00:00:00Z", *from)
		}
		o.from = t
	}
	return o, nil
}

// backfillPart is one partition of a backfill's plan.
type backfillPart struct {
	store.BackfillPosition
	recorded bool // the range was recorded by an earlier run
	low      int64
}

// backfillPlan is what a backfill does: a dry run prints it, --execute
// carries it out. Both make it the same way.
type backfillPlan struct {
	pipeline, topic string
	parts           []backfillPart
	notes           []string
}

// remaining is how many offsets the plan has left to apply.
func (p backfillPlan) remaining() int64 {
	var n int64
	for _, x := range p.parts {
		n += x.Remaining()
	}
	return n
}

// planBackfill decides each partition's range from where the pipeline
// began live (its origin), what an earlier run recorded and where the
// topic starts, and refuses what a backfill cannot do right: a partition
// without an origin (the pipeline has not applied a batch there yet), an
// adopted origin (the history may already be applied), a definition that
// is not the one the pipeline runs with, a recorded range that ends
// elsewhere than the origin or in the other direction. start returns
// where a new range starts on a partition (from the earliest offset, or
// --from-datetime), low is the partition's earliest offset. descending:
// new ranges are applied from their end down (an upsert without a
// version).
func planBackfill(name, topic, fingerprint string, parts []int32, origins []store.BackfillOrigin,
	recorded []store.BackfillPosition, low map[int32]int64, start map[int32]int64, descending bool) (backfillPlan, error) {
	plan := backfillPlan{pipeline: name, topic: topic}
	byPart := map[int32]store.BackfillOrigin{}
	for _, o := range origins {
		byPart[o.Partition] = o
	}
	rec := map[int32]store.BackfillPosition{}
	for _, r := range recorded {
		rec[r.Partition] = r
	}
	var problems []string
	for _, p := range parts {
		o, ok := byPart[p]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s[%d]: pipeline %s has not started live there yet (no origin recorded): start `ratchet run` with it and let it apply a batch of each partition first; the backfill ends where it began", topic, p, name))
			continue
		case o.Topic != topic:
			problems = append(problems, fmt.Sprintf("%s[%d]: pipeline %s began live on topic %s, it now reads %s: `ratchet pipelines reset %s --execute` first", topic, p, name, o.Topic, topic, name))
			continue
		case o.Adopted:
			problems = append(problems, fmt.Sprintf("%s[%d]: pipeline %s was already running before its origin was recorded (adopted at offset %d): what lies before may be applied already, and a backfill would count it twice", topic, p, name, o.LiveFrom))
			continue
		case o.Fingerprint != fingerprint:
			problems = append(problems, fmt.Sprintf("%s[%d]: pipeline %s began live with another definition (fingerprint %s, configured %s): backfill with the definition it runs with, or give the new one a new name", topic, p, name, short(o.Fingerprint), short(fingerprint)))
			continue
		}
		part := backfillPart{low: low[p]}
		if r, ok := rec[p]; ok {
			if r.To != o.LiveFrom {
				problems = append(problems, fmt.Sprintf("%s[%d]: the recorded backfill of pipeline %s ends at %d, but it began live at %d (reset since?): `ratchet pipelines reset %s --execute` forgets both", topic, p, name, r.To, o.LiveFrom, name))
				continue
			}
			if r.Descending != descending {
				problems = append(problems, fmt.Sprintf("%s[%d]: the recorded backfill of pipeline %s was applied in the other order (descending %t): `ratchet pipelines reset %s --execute` forgets it", topic, p, name, r.Descending, name))
				continue
			}
			part.BackfillPosition, part.recorded = r, true
			// The lowest offset the backfill has still to apply.
			lowest := r.Next
			if r.Descending {
				lowest = r.From
			}
			if r.Remaining() > 0 && lowest < low[p] {
				plan.notes = append(plan.notes, fmt.Sprintf("%s[%d]: offsets %d..%d of the backfill are no longer in the topic (retention): they are passed over", topic, p, lowest, low[p]-1))
			}
		} else {
			from := min(max(start[p], low[p]), o.LiveFrom)
			part.BackfillPosition = store.BackfillPosition{Topic: topic, Partition: p, From: from, To: o.LiveFrom, Next: from, Descending: descending}
			if descending {
				part.Next = o.LiveFrom
			}
		}
		plan.parts = append(plan.parts, part)
	}
	if len(problems) > 0 {
		return plan, fmt.Errorf("pipelines backfill %s refused:\n  %s", name, strings.Join(problems, "\n  "))
	}
	return plan, nil
}

func short(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

// writeBackfillPlan prints the plan: per partition from, to and what
// remains.
func writeBackfillPlan(w io.Writer, plan backfillPlan, execute bool) {
	fmt.Fprintf(w, "backfill of pipeline %s from %s, up to where it began live:\n", plan.pipeline, plan.topic)
	if len(plan.parts) > 0 && plan.parts[0].Descending {
		fmt.Fprintln(w, "  (an upsert without upsert.version: each partition is read from its newest record down, and a backfilled record writes a row only where the table has none for its key)")
	}
	for _, p := range plan.parts {
		state := "new"
		if p.recorded {
			state = fmt.Sprintf("recorded, %d records applied so far", p.Records)
		}
		if p.Remaining() == 0 {
			state += ", done"
		}
		next := fmt.Sprintf("next %d", p.Next)
		if p.Descending {
			next = fmt.Sprintf("applied down to %d", p.Next)
		}
		fmt.Fprintf(w, "  %s[%d]: from %d to %d (exclusive), %s, %d offsets to apply (%s)\n",
			p.Topic, p.Partition, p.From, p.To, next, p.Remaining(), state)
	}
	for _, n := range plan.notes {
		fmt.Fprintln(w, "  note: "+n)
	}
	fmt.Fprintf(w, "%d offsets to apply in all\n", plan.remaining())
	if !execute {
		fmt.Fprintln(w, "dry run: nothing applied (add --execute)")
	}
}

// backfillCmd runs `ratchet pipelines backfill NAME`.
func backfillCmd(ctx context.Context, e *env, args []string) error {
	o, err := parseBackfillArgs(e, args)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(e, o.config)
	if err != nil {
		return err
	}
	if err := engine.Check(cfg, engine.Options{}); err != nil {
		return err
	}
	return runBackfill(ctx, e.stdout, cfg, o)
}

// runBackfill plans the backfill of o.name and, with o.execute, carries
// it out.
func runBackfill(ctx context.Context, w io.Writer, cfg config.Config, o backfillOptions) error {
	var pc *config.Pipeline
	for i := range cfg.Pipelines {
		if cfg.Pipelines[i].Name == o.name {
			pc = &cfg.Pipelines[i]
		}
	}
	if pc == nil {
		names := make([]string, len(cfg.Pipelines))
		for i, p := range cfg.Pipelines {
			names[i] = p.Name
		}
		return &config.Error{Problems: []config.Problem{{Key: "pipelines", Reason: fmt.Sprintf("no pipeline named %q (configured: %s)", o.name, strings.Join(names, ", "))}}}
	}
	fp, _, err := pipeline.Fingerprint(*pc)
	if err != nil {
		return err
	}
	pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	bf, err := engine.NewBackfiller(ctx, cfg, pool, o.name, nil)
	if err != nil {
		return err
	}
	k, err := openKafka(cfg, backfillGroup)
	if err != nil {
		return err
	}
	defer k.Close()
	group := cfg.Kafka.GroupID
	plan, err := makeBackfillPlan(ctx, k, pool, group, o, bf, fp)
	if err != nil {
		return err
	}
	if !o.execute {
		writeBackfillPlan(w, plan, false)
		return nil
	}
	var bm *backfillMetrics
	if o.metrics != "" {
		var stop func()
		if bm, stop, err = serveBackfillMetrics(o.metrics, o.name); err != nil {
			return err
		}
		defer stop()
		fmt.Fprintf(w, "metrics on http://%s/metrics\n", bm.addr)
	}
	owner := leaseOwner()
	lease, err := store.LockBackfill(ctx, pool, group, o.name, owner)
	if err != nil {
		return err
	}
	defer func() { _ = lease.Release(ctx) }()
	// Planned again under the lease: another run may have moved the
	// position since.
	if plan, err = makeBackfillPlan(ctx, k, pool, group, o, bf, fp); err != nil {
		return err
	}
	var fresh []store.BackfillPosition
	for _, p := range plan.parts {
		if !p.recorded {
			fresh = append(fresh, p.BackfillPosition)
		}
	}
	if err := store.StartBackfill(ctx, pool, group, o.name, fresh); err != nil {
		return err
	}
	if plan, err = makeBackfillPlan(ctx, k, pool, group, o, bf, fp); err != nil {
		return err
	}
	writeBackfillPlan(w, plan, true)
	p, err := newDLQProducer(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	r := &backfiller{w: w, cfg: cfg, k: k, pool: pool, bf: bf, lease: lease, dlq: p, name: o.name,
		step: store.BackfillStep{Group: group, Pipeline: o.name, Owner: owner}, batchSize: cfg.Processing.BatchSize,
		rate: o.rate, total: plan.remaining(), started: time.Now(), metrics: bm}
	r.store = store.New(pool, bf.Processor)
	r.lastProgress = r.started
	r.metrics.update(r)
	for _, part := range plan.parts {
		if part.Remaining() == 0 {
			continue
		}
		if err := r.partition(ctx, part); err != nil {
			r.progress(true)
			return err
		}
	}
	r.progress(true)
	fmt.Fprintf(w, "backfill of pipeline %s done: %d records applied, %d dead-lettered, %d passed over\n", o.name, r.applied, r.dead, r.skipped)
	return nil
}

// makeBackfillPlan reads what planBackfill decides from.
func makeBackfillPlan(ctx context.Context, k *kafkaTool, pool *pgxpool.Pool, group string, o backfillOptions, bf *engine.Backfiller, fp string) (backfillPlan, error) {
	topic := bf.Topic
	all, err := k.topics()
	if err != nil {
		return backfillPlan{}, err
	}
	parts, ok := all[topic]
	if !ok {
		return backfillPlan{}, fmt.Errorf("pipelines backfill %s: topic %s does not exist", o.name, topic)
	}
	slices.Sort(parts)
	origins, err := store.BackfillOrigins(ctx, pool, group, o.name)
	if err != nil {
		return backfillPlan{}, err
	}
	recorded, err := store.Backfills(ctx, pool, group, o.name)
	if err != nil {
		return backfillPlan{}, err
	}
	low, start, high := map[int32]int64{}, map[int32]int64{}, map[int32]int64{}
	for _, p := range parts {
		e, err := k.ends(ctx, topic, p)
		if err != nil {
			return backfillPlan{}, err
		}
		low[p], start[p], high[p] = e.low, e.low, e.high
	}
	// A partition that received no record since the pipeline was added
	// has no origin; where the group is at rest (its stored position is
	// the partition's end) the pipeline begins there: recorded with
	// --execute, shown by a dry run.
	var atRest []store.BackfillOrigin
	if len(origins) < len(parts) {
		if atRest, err = store.OriginsAtRest(ctx, pool, group, o.name, topic, fp, high, o.execute); err != nil {
			return backfillPlan{}, err
		}
		if o.execute && len(atRest) > 0 {
			if origins, err = store.BackfillOrigins(ctx, pool, group, o.name); err != nil {
				return backfillPlan{}, err
			}
		} else {
			origins = append(origins, atRest...)
		}
	}
	if !o.from.IsZero() {
		var tps []kafka.TopicPartition
		for _, p := range parts {
			t := topic
			tps = append(tps, kafka.TopicPartition{Topic: &t, Partition: p, Offset: kafka.Offset(o.from.UnixMilli())})
		}
		res, err := k.c.OffsetsForTimes(tps, kafkaTimeoutMs)
		if err != nil {
			return backfillPlan{}, fmt.Errorf("offsets of %s at %s: %w", topic, o.from.Format(time.RFC3339), err)
		}
		for _, r := range res {
			if r.Error != nil {
				return backfillPlan{}, fmt.Errorf("offset of %s[%d] at %s: %w", topic, r.Partition, o.from.Format(time.RFC3339), r.Error)
			}
			if r.Offset < 0 {
				start[r.Partition] = 1<<63 - 1 // no record at or after the time: nothing before the origin either
			} else {
				start[r.Partition] = int64(r.Offset)
			}
		}
	}
	plan, err := planBackfill(o.name, topic, fp, parts, origins, recorded, low, start, bf.Descending)
	for _, r := range atRest {
		verb := "begins"
		if o.execute {
			verb = "began"
		}
		plan.notes = append(plan.notes, fmt.Sprintf("%s[%d]: no record since pipeline %s was added; the group applied everything up to the partition's end, %d, where the pipeline %s live (recorded with --execute)",
			topic, r.Partition, o.name, r.LiveFrom, verb))
	}
	return plan, err
}

// newDLQProducer is the producer a backfill writes its dead letters with.
func newDLQProducer(cfg config.Config) (*kafka.Producer, error) {
	m := kafkaclient.ProducerConfig(cfg.Kafka.Brokers, cfg.Kafka.Properties)
	_ = m.SetKey("go.logs.channel.enable", false)
	_ = m.SetKey("log_level", 3)
	p, err := kafka.NewProducer(m)
	if err != nil {
		return nil, fmt.Errorf("new kafka producer: %w", err)
	}
	return p, nil
}

// backfiller is one `pipelines backfill --execute` run.
type backfiller struct {
	w         io.Writer
	cfg       config.Config
	k         *kafkaTool
	pool      *pgxpool.Pool
	store     *store.Store
	bf        *engine.Backfiller
	lease     *store.Lease
	dlq       *kafka.Producer
	name      string
	step      store.BackfillStep
	batchSize int
	rate      float64

	metrics *backfillMetrics // nil: not served

	total, done            int64 // offsets of the plan, and passed so far
	applied, dead, skipped int64
	started, lastProgress  time.Time
	lastDone               int64
}

// held returns the lease's error once it is lost, or ctx's.
func (r *backfiller) held(ctx context.Context) error {
	select {
	case <-r.lease.Lost():
		return r.lease.Err()
	default:
	}
	return ctx.Err()
}

// partition applies part's range from its recorded position to its end,
// a batch of at most processing.batch_size records per transaction. It
// reads with a consumer of its own assignment (no group, no commits) and
// ends by position, as readPartition does: offsets without a record
// (transaction markers, compacted records) pass with the batch after them.
func (r *backfiller) partition(ctx context.Context, part backfillPart) error {
	if part.Descending {
		return r.partitionDescending(ctx, part)
	}
	topic, p := part.Topic, part.Partition
	dec := r.bf.Decoder(topic)
	if err := r.assign(topic, p, max(part.Next, part.low)); err != nil {
		return err
	}
	defer func() { _ = r.k.c.Unassign() }()
	start, at, end := part.Next, max(part.Next, part.low), part.To
	var batch []processor.Record
	flush := func(next int64) error {
		if err := r.apply(ctx, dec, topic, p, batch, start, next, false); err != nil {
			return err
		}
		r.done += next - start
		start, batch = next, nil
		r.progress(false)
		return nil
	}
	for at < end {
		rec, err := r.read(ctx, topic, p, &at, end)
		if err != nil {
			return fmt.Errorf("backfill %s[%d] at %d: %w", topic, p, start, err)
		}
		if rec != nil {
			batch = append(batch, *rec)
		}
		if len(batch) >= r.batchSize || (at >= end && at > start) {
			if err := flush(at); err != nil {
				return err
			}
		}
	}
	if start < end {
		return flush(end)
	}
	return nil
}

// partitionDescending applies part's range from its end down, a
// transaction per processing.batch_size offsets: each step reads the
// offsets below the position and applies them, marked as older than the
// table's rows (pipeline.HeaderBackfill), so that for an upsert without a
// version the newest record of a key before the origin is written first
// and the older ones only where no row is. Offsets no longer in the topic
// pass in one step.
func (r *backfiller) partitionDescending(ctx context.Context, part backfillPart) error {
	topic, p := part.Topic, part.Partition
	dec := r.bf.Decoder(topic)
	defer func() { _ = r.k.c.Unassign() }()
	for hi := part.Next; hi > part.From; {
		lo := max(part.From, hi-int64(r.batchSize))
		var batch []processor.Record
		if hi <= part.low {
			lo = part.From // retention took the rest
		} else {
			at := max(lo, part.low)
			if err := r.assign(topic, p, at); err != nil {
				return err
			}
			for at < hi {
				rec, err := r.read(ctx, topic, p, &at, hi)
				if err != nil {
					return fmt.Errorf("backfill %s[%d] at %d: %w", topic, p, hi, err)
				}
				if rec != nil {
					batch = append(batch, *rec)
				}
			}
		}
		if err := r.apply(ctx, dec, topic, p, batch, lo, hi, true); err != nil {
			return err
		}
		r.done += hi - lo
		hi = lo
		r.progress(false)
	}
	return nil
}

// assign points the backfill's consumer at topic[p] from offset.
func (r *backfiller) assign(topic string, p int32, offset int64) error {
	if err := r.k.c.Assign([]kafka.TopicPartition{{Topic: &topic, Partition: p, Offset: kafka.Offset(offset)}}); err != nil {
		return fmt.Errorf("read %s[%d]: %w", topic, p, err)
	}
	return nil
}

// read polls the consumer assigned to topic[p] once and moves *at, the
// first offset not read yet, toward end: it returns the record read when
// it is one of the range (offsets before *at are passed over, the first
// at or past end ends the range), and moves *at on the end of the
// partition and on the consumer's position when nothing came.
func (r *backfiller) read(ctx context.Context, topic string, p int32, at *int64, end int64) (*processor.Record, error) {
	if err := r.held(ctx); err != nil {
		return nil, fmt.Errorf("%w (a rerun continues from the recorded position)", err)
	}
	switch m := r.k.c.Poll(200).(type) {
	case *kafka.Message:
		if m.TopicPartition.Error != nil {
			return nil, fmt.Errorf("read %s[%d]: %w", topic, p, m.TopicPartition.Error)
		}
		off := int64(m.TopicPartition.Offset)
		switch {
		case off < *at:
			return nil, nil
		case off >= end:
			*at = end // past the range
			return nil, nil
		}
		*at = off + 1
		rec := sampleRecord(topic, p, m)
		return &rec, nil
	case kafka.PartitionEOF:
		if m.Topic != nil && *m.Topic == topic && m.Partition == p {
			*at = max(*at, min(int64(m.Offset), end))
		}
	case kafka.Error:
		if m.IsFatal() {
			return nil, fmt.Errorf("read %s[%d]: %w", topic, p, m)
		}
	case nil:
		ps, err := r.k.c.Position([]kafka.TopicPartition{{Topic: &topic, Partition: p}})
		if err == nil && len(ps) == 1 && ps[0].Offset >= 0 {
			*at = max(*at, min(int64(ps[0].Offset), end))
		}
	}
	return nil, nil
}

// apply applies recs, the records of offsets start..next-1 that are still
// in the topic, and moves the position from start to next (from next down
// to start when descending, the records then marked as older than the
// table's rows) in the same transaction. A record the decoder refuses is
// dead-lettered first; a record the pipeline or PostgreSQL refuses is
// isolated by halving the batch, as the engine does, and dead-lettered; a
// replay for another consumer group is passed over.
func (r *backfiller) apply(ctx context.Context, dec actors.ValueDecoder, topic string, p int32, recs []processor.Record, start, next int64, descending bool) error {
	good := make([]processor.Record, 0, len(recs))
	var letters []actors.Letter
	var decoding []bool
	for _, rec := range recs {
		if err := resolve(ctx, dec, rec.Value); err != nil {
			return err
		}
		err := dec.DecodeRecord(&rec)
		switch {
		case errors.Is(err, actors.ErrSkip):
			r.skipped++
		case err != nil:
			letters = append(letters, actors.Letter{Record: rec, Reason: err, Attempts: 1})
			decoding = append(decoding, true)
		case descending:
			rec.Headers = append(slices.Clip(rec.Headers), processor.Header{Key: pipeline.HeaderBackfill, Value: []byte(r.name)})
			good = append(good, rec)
		default:
			good = append(good, rec)
		}
	}
	if err := r.deadLetter(ctx, letters, decoding); err != nil {
		return err
	}
	return r.applyRange(ctx, topic, p, good, start, next, descending)
}

// applyRange applies recs with the position move start..next (next..start
// when descending), halving on a record's error until the record is
// alone, which is dead-lettered. Descending, the newer half goes first.
func (r *backfiller) applyRange(ctx context.Context, topic string, p int32, recs []processor.Record, start, next int64, descending bool) error {
	err := r.applyOnce(ctx, topic, p, recs, start, next, descending)
	if err == nil || !store.IsRecordError(err) || store.IsConfigurationError(err) {
		return err
	}
	if len(recs) == 1 {
		if err := r.deadLetter(ctx, []actors.Letter{{Record: recs[0], Reason: err, Attempts: 1}}, []bool{false}); err != nil {
			return err
		}
		return r.applyOnce(ctx, topic, p, nil, start, next, descending)
	}
	mid := len(recs) / 2
	older := func() error { return r.applyRange(ctx, topic, p, recs[:mid], start, recs[mid].Offset, descending) }
	newer := func() error { return r.applyRange(ctx, topic, p, recs[mid:], recs[mid].Offset, next, descending) }
	if descending {
		older, newer = newer, older
	}
	if err := older(); err != nil {
		return err
	}
	return newer()
}

// applyOnce applies one batch in one transaction, trying again what may
// pass later (the database unreachable, a deadlock) for as long as the
// lease is held. The rate limit is applied before.
func (r *backfiller) applyOnce(ctx context.Context, topic string, p int32, recs []processor.Record, start, next int64, descending bool) error {
	if err := r.limit(ctx, len(recs)); err != nil {
		return err
	}
	step := r.step
	step.Records, step.Descending = int64(len(recs)), descending
	b := processor.Batch{Topic: topic, Partition: p, Start: start, Next: next, Records: recs}
	wait := 100 * time.Millisecond
	for {
		if err := r.held(ctx); err != nil {
			return fmt.Errorf("backfill %s[%d] at %d: %w (a rerun continues from the recorded position)", topic, p, start, err)
		}
		err := r.store.ApplyWith(ctx, b, nil, store.ApplyOptions{Backfill: &step})
		if err == nil {
			r.applied += int64(len(recs))
			return nil
		}
		if errors.Is(err, store.ErrBackfillMoved) {
			return fmt.Errorf("%w: another run of this backfill moved it; rerun to continue from the recorded position", err)
		}
		// A COMMIT without an answer: the recorded position says whether
		// it took effect, and the next try's guard refuses a second
		// application (ErrBackfillMoved), so it is tried like the rest.
		if !store.IsTransient(err) && !store.IsCommitUnknown(err) {
			return err
		}
		fmt.Fprintf(r.w, "backfill %s[%d] at %d: %v; trying again in %v\n", topic, p, start, err, wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-r.lease.Lost():
			t.Stop()
			return r.lease.Err()
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// limit waits until n more records keep the run within --rate.
func (r *backfiller) limit(ctx context.Context, n int) error {
	if r.rate <= 0 || n == 0 {
		return nil
	}
	due := r.started.Add(time.Duration(float64(r.applied+int64(n)) / r.rate * float64(time.Second)))
	d := time.Until(due)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// deadLetter writes letters to the topic's dead-letter topic with the
// engine's headers and HeaderBackfill, and returns once every one is
// delivered (before the batch that passes them is committed).
func (r *backfiller) deadLetter(ctx context.Context, letters []actors.Letter, decoding []bool) error {
	if len(letters) == 0 {
		return nil
	}
	deliveries := make(chan kafka.Event, len(letters))
	outstanding := 0
	defer func() {
		if outstanding > 0 {
			_ = r.dlq.Purge(kafka.PurgeQueue | kafka.PurgeInFlight | kafka.PurgeNonBlocking)
		}
	}()
	for i := range letters {
		l := &letters[i]
		l.FailedAt = time.Now()
		topic := r.cfg.Kafka.DLQTopic(l.Record.Topic)
		// A record of a descending backfill already carries the mark: the
		// dead letter has it once.
		l.Record.Headers = slices.DeleteFunc(slices.Clone(l.Record.Headers), func(h processor.Header) bool {
			return h.Key == pipeline.HeaderBackfill && string(h.Value) == r.name
		})
		headers := append(actors.DeadLetterHeaders(*l, decoding[i]), kafka.Header{Key: pipeline.HeaderBackfill, Value: []byte(r.name)})
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key: l.Record.Key, Value: l.Record.Value, Timestamp: l.Record.Timestamp, Headers: headers}
		for {
			err := r.dlq.Produce(m, deliveries)
			var ke kafka.Error
			if errors.As(err, &ke) && ke.Code() == kafka.ErrQueueFull {
				r.dlq.Flush(100)
				continue
			}
			if err != nil {
				return fmt.Errorf("dead letter %s[%d]@%d: %w", l.Record.Topic, l.Record.Partition, l.Record.Offset, err)
			}
			outstanding++
			break
		}
		fmt.Fprintf(r.w, "dead-lettered %s[%d]@%d to %s: %s\n", l.Record.Topic, l.Record.Partition, l.Record.Offset, topic,
			oneLine(r.shown(l.Reason)))
	}
	for range letters {
		select {
		case ev := <-deliveries:
			outstanding--
			if m, ok := ev.(*kafka.Message); ok && m.TopicPartition.Error != nil {
				return fmt.Errorf("dead letter: %w (a rerun writes it again)", m.TopicPartition.Error)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.dead += int64(len(letters))
	return nil
}

// shown is a dead letter's reason as the log shows it: without the
// record's values unless log.include_values.
func (r *backfiller) shown(err error) string {
	if r.cfg.Log.IncludeValues {
		return err.Error()
	}
	return redact.Values(err.Error())
}

// progress prints a progress line every backfillProgressEvery (always
// with final): offsets passed of the plan, records applied, the rate
// since the last line, and what remains.
func (r *backfiller) progress(final bool) {
	r.metrics.update(r)
	now := time.Now()
	if !final && now.Sub(r.lastProgress) < backfillProgressEvery {
		return
	}
	secs := now.Sub(r.lastProgress).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(r.done-r.lastDone) / secs
	}
	r.lastProgress, r.lastDone = now, r.done
	fmt.Fprintf(r.w, "backfill %s: %d of %d offsets (%d records applied, %d dead-lettered), %.0f records/s, %d remaining\n",
		r.name, r.done, r.total, r.applied, r.dead, rate, r.total-r.done)
}
