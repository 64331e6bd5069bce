package cli

// `ratchet pipelines check --sample N`: the pipelines run on the last
// records of their topics, in a transaction that is rolled back. The
// records are read with a consumer that is assigned partitions and never
// joins or commits to a group, decoded by the decoders `ratchet run`
// builds (engine.NewSampler), and applied one by one, each inside a
// savepoint, so that a record PostgreSQL refuses is attributed to it and
// the next record finds the transaction usable. Savepoints live inside
// one transaction, so this works behind a pooler in transaction mode.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/redact"
	"ratchet/internal/store"
	"ratchet/processor"
)

// sampleGroup is the group id of the sampling consumer. It never joins the
// group (partitions are assigned) and never commits: librdkafka wants a
// group id all the same.
const sampleGroup = "ratchet-pipelines-check"

// defaultSampleThreshold is the share of a sample a pipeline may
// dead-letter before `check --sample` fails (exit code 2).
const defaultSampleThreshold = 0.5

// Sample results of one record for one pipeline.
const (
	sampleWritten      = "written"
	sampleFiltered     = "filtered"
	sampleIgnored      = "ignored"
	sampleDeadLettered = "dead_lettered"
	// sampleBlocked: another pipeline of the topic dead-lettered the
	// record, so this one does not apply it either.
	sampleBlocked = "blocked"
)

// splitSample returns how many of the last records to read from each
// partition so that n records are read from the topic in all: an equal
// share each, a partition holding fewer than its share giving the rest to
// the others (the smallest first), and the remainder of an uneven split
// going to the lowest partition numbers. avail is how many records each
// partition holds (its high watermark less its first offset). The result
// is the same for the same input.
func splitSample(n int64, avail map[int32]int64) map[int32]int64 {
	out := make(map[int32]int64, len(avail))
	parts := slices.Collect(maps.Keys(avail))
	slices.SortFunc(parts, func(a, b int32) int { return cmp.Or(cmp.Compare(avail[a], avail[b]), cmp.Compare(a, b)) })
	left := n
	// Partitions holding no more than an equal share of what is left give
	// all they hold, the smallest first.
	for len(parts) > 0 && max(avail[parts[0]], 0) <= left/int64(len(parts)) {
		out[parts[0]] = max(avail[parts[0]], 0)
		left -= out[parts[0]]
		parts = parts[1:]
	}
	if len(parts) == 0 {
		return out
	}
	// The others each hold more than their share: they give it, and the
	// remainder goes one each to the lowest partition numbers.
	share, extra := left/int64(len(parts)), left%int64(len(parts))
	slices.Sort(parts)
	for i, p := range parts {
		out[p] = share
		if int64(i) < extra {
			out[p]++
		}
	}
	return out
}

// sampleCounters records, for the record being applied, what each
// pipeline made of it (pipeline.Counters). Only Process calls it, on the
// command's one goroutine.
type sampleCounters struct{ got map[string]string }

func (c *sampleCounters) Records(name, result string, n int) {
	if n > 0 {
		c.got[name] = result
	}
}

func (c *sampleCounters) Rows(string, string, int) {}

// sampleReasonKey is a reason a pipeline dead-lettered sampled records for.
type sampleReasonKey struct {
	class, sqlstate string
}

// sampleReason counts one reason, with the first record as its example.
type sampleReason struct {
	n         int
	partition int32
	offset    int64
	text      string
}

// pipelineSample is what one pipeline made of its topic's sample.
type pipelineSample struct {
	index   int // in cfg.Pipelines
	name    string
	topic   string
	sampled int
	results map[string]int
	reasons map[sampleReasonKey]*sampleReason
}

func (s *pipelineSample) count(result string) { s.results[result]++ }

func (s *pipelineSample) deadLetter(r actors.Reason, partition int32, offset int64, text string) {
	s.results[sampleDeadLettered]++
	k := sampleReasonKey{r.Class, r.SQLState}
	x := s.reasons[k]
	if x == nil {
		x = &sampleReason{partition: partition, offset: offset, text: text}
		s.reasons[k] = x
	}
	x.n++
}

// deadShare is the share of the sample s dead-lettered.
func (s *pipelineSample) deadShare() float64 {
	if s.sampled == 0 {
		return 0
	}
	return float64(s.results[sampleDeadLettered]) / float64(s.sampled)
}

// runSample reads the last n records of every pipeline's topic, applies
// them in a transaction it rolls back, writes what each pipeline would
// have done to w, and returns a *config.Error (exit code 2) naming every
// pipeline that dead-lettered more than threshold of its sample.
//
// The examples' reasons are shown without the record values they quote
// unless log.include_values, as `dlq ls` shows them.
func runSample(ctx context.Context, w io.Writer, cfg config.Config, pool *pgxpool.Pool, n int64, threshold float64) error {
	counters := &sampleCounters{got: map[string]string{}}
	sampler, err := engine.NewSampler(ctx, cfg, pool, counters)
	if err != nil {
		return err
	}
	k, err := openKafka(cfg, sampleGroup)
	if err != nil {
		return err
	}
	defer k.Close()
	all, err := k.topics()
	if err != nil {
		return err
	}
	var topics []string
	byTopic := map[string][]*pipelineSample{}
	var samples []*pipelineSample
	for i, p := range cfg.Pipelines {
		if _, ok := byTopic[p.Topic]; !ok {
			topics = append(topics, p.Topic)
		}
		s := &pipelineSample{index: i, name: p.Name, topic: p.Topic, results: map[string]int{}, reasons: map[sampleReasonKey]*sampleReason{}}
		byTopic[p.Topic] = append(byTopic[p.Topic], s)
		samples = append(samples, s)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("sample: begin: %w", err)
	}
	// Nothing the sample wrote may stay: the transaction is never
	// committed, whatever happens below.
	defer func() {
		// Also once ctx ended; bounded, as every wait of the command.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	for _, topic := range topics {
		parts, ok := all[topic]
		if !ok {
			fmt.Fprintf(w, "sample of %s: no such topic, nothing sampled\n", topic)
			continue
		}
		avail := map[int32]int64{}
		ends := map[int32]partitionEnds{}
		for _, p := range parts {
			e, err := k.ends(ctx, topic, p)
			if err != nil {
				return err
			}
			ends[p], avail[p] = e, e.stable-e.low
		}
		take := splitSample(n, avail)
		var ranges []string
		for _, p := range parts {
			if take[p] == 0 {
				continue
			}
			from := ends[p].stable - take[p]
			ranges = append(ranges, fmt.Sprintf("%d: %d..%d", p, from, ends[p].stable-1))
			dec := sampler.Decoder(topic) // one per partition, as the engine does
			// Each record is applied as it is read: the sample holds one
			// record at a time, however large N is.
			if _, err := k.readPartition(ctx, topic, p, from, func(m *kafka.Message) error {
				rec := sampleRecord(topic, p, m)
				if err := resolve(ctx, dec, rec.Value); err != nil {
					return err
				}
				return applySample(ctx, tx, sampler.Processor, counters, byTopic[topic], rec, dec.DecodeRecord(&rec))
			}); err != nil {
				return err
			}
		}
		if len(ranges) == 0 {
			fmt.Fprintf(w, "sample of %s: the topic is empty, nothing sampled\n", topic)
			continue
		}
		fmt.Fprintf(w, "sample of %s: offsets %s\n", topic, strings.Join(ranges, ", "))
	}
	if !cfg.Log.IncludeValues {
		for _, s := range samples {
			for _, r := range s.reasons {
				r.text = redact.Values(r.text)
			}
		}
	}
	writeSample(w, samples)
	var problems []config.Problem
	for _, s := range samples {
		if s.sampled > 0 && s.deadShare() > threshold {
			problems = append(problems, config.Problem{Key: fmt.Sprintf("pipelines[%d]", s.index),
				Reason: fmt.Sprintf("pipeline %s would dead-letter %d of %d sampled records of %s (%s), more than --threshold %g%s",
					s.name, s.results[sampleDeadLettered], s.sampled, s.topic, percent(s.deadShare()), threshold, topReason(s))})
		}
	}
	if len(problems) > 0 {
		return &config.Error{Problems: problems}
	}
	return nil
}

// applySample applies one record to the pipelines of its topic inside a
// savepoint of tx, and counts what each made of it. A record error (one
// the engine would dead-letter) is counted against the pipeline it names,
// or every pipeline of the topic when it names none (a decode failure);
// any other error (the database unreachable, a table's fault) ends the
// sample: it says nothing about the record. A record `ratchet dlq replay`
// re-produced for another consumer group is not counted.
func applySample(ctx context.Context, tx pgx.Tx, proc processor.Processor, counters *sampleCounters, pls []*pipelineSample, rec processor.Record, decodeErr error) error {
	if errors.Is(decodeErr, actors.ErrSkip) {
		return nil // a replay for another consumer group: the engine passes it by, so does the sample
	}
	for _, s := range pls {
		s.sampled++
	}
	if decodeErr != nil {
		r := actors.ClassifyReason(decodeErr, true)
		for _, s := range pls {
			s.deadLetter(r, rec.Partition, rec.Offset, decodeErr.Error())
		}
		return nil
	}
	clear(counters.got)
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("sample: savepoint: %w", err)
	}
	err = proc.Process(ctx, sp, processor.Batch{Topic: rec.Topic, Partition: rec.Partition, Start: rec.Offset,
		Next: rec.Offset + 1, Records: []processor.Record{rec}})
	if err == nil {
		if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT: the next records see this one's rows
			return fmt.Errorf("sample: release savepoint: %w", err)
		}
		for _, s := range pls {
			s.count(cmp.Or(counters.got[s.name], sampleIgnored))
		}
		return nil
	}
	if rerr := sp.Rollback(ctx); rerr != nil {
		return fmt.Errorf("sample: rollback to savepoint: %w (after %w)", rerr, err)
	}
	if !store.IsRecordError(err) {
		return fmt.Errorf("sample %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	r := actors.ClassifyReason(err, false)
	named := false
	for _, s := range pls {
		if s.name == r.Pipeline {
			s.deadLetter(r, rec.Partition, rec.Offset, err.Error())
			named = true
		}
	}
	if !named {
		for _, s := range pls {
			s.deadLetter(r, rec.Partition, rec.Offset, err.Error())
		}
		return nil
	}
	// The record is atomic across its topic's pipelines: the others do not
	// apply it either.
	for _, s := range pls {
		if s.name != r.Pipeline {
			s.count(sampleBlocked)
		}
	}
	return nil
}

// sampleRecord is m as the partition actor hands it to its decoder.
func sampleRecord(topic string, partition int32, m *kafka.Message) processor.Record {
	rec := processor.Record{Topic: topic, Partition: partition, Offset: int64(m.TopicPartition.Offset),
		Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
	switch m.TimestampType {
	case kafka.TimestampCreateTime:
		rec.TimestampType = processor.TimestampCreateTime
	case kafka.TimestampLogAppendTime:
		rec.TimestampType = processor.TimestampLogAppendTime
	}
	for _, h := range m.Headers {
		rec.Headers = append(rec.Headers, processor.Header{Key: h.Key, Value: h.Value})
	}
	return rec
}

// resolve makes dec able to decode value when it must look something up
// first (a schema registry's schema). An unavailable registry ends the
// sample: it says nothing about the record.
func resolve(ctx context.Context, dec actors.ValueDecoder, value []byte) error {
	r, ok := dec.(actors.Resolver)
	if !ok || value == nil || !r.Missing(value) {
		return nil
	}
	learn, err := r.Resolve(ctx, [][]byte{value})
	if err != nil {
		return fmt.Errorf("sample: schema registry: %w", err)
	}
	learn()
	return nil
}

// writeSample prints a line per pipeline with its counts, and under it
// the reasons it dead-lettered records for, each with its count and the
// first record as an example.
func writeSample(w io.Writer, samples []*pipelineSample) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PIPELINE\tTOPIC\tSAMPLED\tWRITTEN\tFILTERED\tIGNORED\tDEAD-LETTERED\tBLOCKED")
	for _, s := range samples {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", s.name, s.topic, s.sampled, s.results[sampleWritten],
			s.results[sampleFiltered], s.results[sampleIgnored], s.results[sampleDeadLettered], s.results[sampleBlocked])
	}
	_ = tw.Flush()
	for _, s := range samples {
		if len(s.reasons) == 0 {
			continue
		}
		fmt.Fprintf(w, "pipeline %s would dead-letter:\n", s.name)
		for _, k := range sortedReasons(s) {
			x := s.reasons[k]
			class := k.class
			if k.sqlstate != "" {
				class += " (sqlstate " + k.sqlstate + ")"
			}
			fmt.Fprintf(w, "  %d %s, e.g. %s[%d]@%d: %s\n", x.n, class, s.topic, x.partition, x.offset, oneLine(x.text))
		}
	}
}

// sortedReasons are s's reasons, the most frequent first.
func sortedReasons(s *pipelineSample) []sampleReasonKey {
	keys := slices.Collect(maps.Keys(s.reasons))
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if na, nb := s.reasons[a].n, s.reasons[b].n; na != nb {
			return na > nb
		}
		return cmp.Or(cmp.Compare(a.class, b.class), cmp.Compare(a.sqlstate, b.sqlstate)) < 0
	})
	return keys
}

// topReason names s's most frequent reason and its example for the exit
// line.
func topReason(s *pipelineSample) string {
	keys := sortedReasons(s)
	if len(keys) == 0 {
		return ""
	}
	x := s.reasons[keys[0]]
	return fmt.Sprintf("; mostly %s, e.g. offset %d of partition %d: %s", keys[0].class, x.offset, x.partition, oneLine(x.text))
}

func percent(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }
