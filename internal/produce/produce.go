// Package produce is the load and demo generator behind `ratchet produce`
// and the demo producer of `ratchet dev`. It writes ratchet.v1.Event records
// (protobuf or protojson) at a steady rate, with a chosen fraction of poison
// records, through a confluent-kafka-go producer tuned for throughput.
//
// The records come from a Generator, which is deterministic for a seed, so
// tests can recompute what a run wrote without reading it back.
package produce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/event"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/tracing"
)

// drainTimeout bounds the final flush when Run stops because ctx is done:
// the records already handed to librdkafka get this long to be delivered.
const drainTimeout = 10 * time.Second

// Options configure Run and NewGenerator.
type Options struct {
	// Brokers are the bootstrap servers.
	Brokers []string
	// Topic receives the records.
	Topic string
	// Rate is records per second; 0 means as fast as possible.
	Rate float64
	// Count is how many records to write; 0 means until ctx is done.
	Count int64
	// PoisonFraction, from 0 to 1, is the share of poison records.
	PoisonFraction float64
	// Format is event.FormatProtobuf (the default when empty) or event.FormatJSON.
	Format string
	// Metrics are the metric names to draw from; empty means
	// DefaultMetrics.
	Metrics []string
	// Seed makes the record sequence reproducible.
	Seed int64
	// Properties are extra librdkafka settings; they override the
	// throughput defaults of Run.
	Properties map[string]string
	// TimeSpread spreads event times uniformly over [now-TimeSpread, now];
	// 0 means now.
	TimeSpread time.Duration
	// Frame, when set, is written before every value: the schema registry
	// wire format's magic byte, schema id and (protobuf) message indexes
	// (see schemareg.RegisterEvent). Poison values are framed too, so they
	// are refused for what they carry, not for a missing frame.
	Frame []byte
	// Now is the clock event times are taken from; nil means time.Now. Fix
	// it to make event times, and so the rollup buckets, deterministic too.
	// It does not affect the pacing of Run.
	Now func() time.Time
	// Tracer, when set, sends each record under a `send <topic>` span
	// whose context the record carries in its `traceparent` header; nil:
	// no spans, no header.
	Tracer *tracing.Tracer
}

// validate reports every problem in o at once.
func (o Options) validate() error {
	var errs []error
	if len(o.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: at least one bootstrap server is required"))
	}
	if o.Topic == "" {
		errs = append(errs, errors.New("topic: must not be empty"))
	}
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) {
		errs = append(errs, fmt.Errorf("rate %v: must be a finite number >= 0", o.Rate))
	}
	if o.Count < 0 {
		errs = append(errs, fmt.Errorf("count %d: must be >= 0", o.Count))
	}
	if !(o.PoisonFraction >= 0 && o.PoisonFraction <= 1) {
		errs = append(errs, fmt.Errorf("poison fraction %v: must be from 0 to 1", o.PoisonFraction))
	}
	switch o.Format {
	case "", event.FormatProtobuf, event.FormatJSON:
	default:
		errs = append(errs, fmt.Errorf("format %q: must be %s or %s", o.Format, event.FormatProtobuf, event.FormatJSON))
	}
	if o.TimeSpread < 0 {
		errs = append(errs, fmt.Errorf("time spread %s: must be >= 0", o.TimeSpread))
	}
	for _, m := range o.Metrics {
		if m == "" || len(m) > 200 {
			errs = append(errs, fmt.Errorf("metric %q: must be 1 to 200 bytes", m))
		}
	}
	return errors.Join(errs...)
}

// Stats count the outcome of Run from the delivery reports.
type Stats struct {
	// Produced is how many records the broker acknowledged, poison
	// included.
	Produced int64
	// Poison is how many of the acknowledged records were poison.
	Poison int64
	// Failed is how many records got a failed delivery report (or were
	// purged because the final flush ran out of time).
	Failed int64
}

// poisonTag marks poison records in Message.Opaque so delivery reports can
// count them. Good records carry no opaque, which keeps the hot path free of
// the client's opaque bookkeeping.
var poisonTag = new(struct{})

// Run writes records from NewGenerator(opts) to opts.Topic until opts.Count
// were handed to the producer or ctx is done, then waits until every
// delivery report has arrived. That final flush is bounded by ctx when Count
// was reached, and by a 10 s grace period when ctx ended the run; records
// still undelivered then are purged and counted as failed.
//
// Run returns an error if opts are invalid, the producer cannot be created,
// a record is refused outright, or any delivery failed. Stopping because ctx
// is done is not an error: Stats says how far it got. A full local queue is
// not an error either: Run waits for room and retries, so no record is
// dropped.
func Run(ctx context.Context, opts Options, log *slog.Logger) (Stats, error) {
	if err := opts.validate(); err != nil {
		return Stats{}, fmt.Errorf("produce options: %w", err)
	}
	if opts.Format == "" {
		opts.Format = event.FormatProtobuf
	}
	if log == nil {
		log = slog.Default()
	}
	cfg := kafka.ConfigMap{
		"bootstrap.servers":            strings.Join(opts.Brokers, ","),
		"linger.ms":                    5,
		"batch.num.messages":           10000,
		"queue.buffering.max.messages": 1000000,
		"compression.type":             "lz4",
		"go.logs.channel.enable":       true,
	}
	for k, v := range kafkaclient.ForProducer(opts.Properties) { // kafka.properties has the consumer's too
		cfg[k] = v
	}
	p, err := kafka.NewProducer(&cfg)
	if err != nil {
		return Stats{}, fmt.Errorf("new producer: %w", err)
	}
	// Closed by p.Close; librdkafka blocks on a full logs channel, so it is
	// always drained.
	logsDone := make(chan struct{})
	go func() {
		defer close(logsDone)
		kafkaclient.ForwardLogs(p.Logs(), log.With("client", "producer"))
	}()

	// The delivery goroutine owns stats and firstErr until reports is
	// closed, which p.Close does after the last report.
	var (
		stats    Stats
		firstErr error
	)
	reportsDone := make(chan struct{})
	go func() {
		defer close(reportsDone)
		for ev := range p.Events() {
			switch e := ev.(type) {
			case *kafka.Message:
				if e.TopicPartition.Error != nil {
					stats.Failed++
					if firstErr == nil {
						firstErr = e.TopicPartition.Error
					}
					continue
				}
				stats.Produced++
				if e.Opaque == poisonTag {
					stats.Poison++
				}
			case kafka.Error:
				if e.IsFatal() {
					log.Error("producer fatal error", "topic", opts.Topic, "error", e)
				} else {
					log.Warn("producer error", "topic", opts.Topic, "error", e)
				}
			}
		}
	}()

	log.Info("producing started", "topic", opts.Topic, "rate", opts.Rate, "count", opts.Count,
		"format", opts.Format, "poison_fraction", opts.PoisonFraction)
	start := time.Now()
	sent, sendErr := send(ctx, p, opts)
	left := finish(ctx, p)
	p.Close()
	<-reportsDone
	<-logsDone

	log.Info("producing stopped", "topic", opts.Topic, "rate", opts.Rate, "count", stats.Produced,
		"sent", sent, "poison", stats.Poison, "failed", stats.Failed, "elapsed", time.Since(start).Round(time.Millisecond))
	var errs []error
	if sendErr != nil {
		errs = append(errs, sendErr)
	}
	if left > 0 {
		errs = append(errs, fmt.Errorf("%d records still queued when the flush gave up", left))
	}
	if stats.Failed > 0 {
		errs = append(errs, fmt.Errorf("%d of %d records not delivered to %s, first: %w", stats.Failed, sent, opts.Topic, firstErr))
	}
	return stats, errors.Join(errs...)
}

// send hands records to p at the pace of opts.Rate until opts.Count were
// sent or ctx is done. It returns how many were accepted by the producer.
func send(ctx context.Context, p *kafka.Producer, opts Options) (int64, error) {
	gen := NewGenerator(opts)
	pace := newPacer(opts.Rate, time.Now())
	topic := opts.Topic
	var sent int64
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for opts.Count == 0 || sent < opts.Count {
		if ctx.Err() != nil {
			return sent, nil
		}
		n := pace.due(time.Now(), sent)
		if n == 0 {
			wait := time.Until(pace.next(sent))
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-ctx.Done():
				return sent, nil
			case <-timer.C:
			}
			continue
		}
		if opts.Count > 0 {
			n = min(n, opts.Count-sent)
		}
		for range n {
			key, value, _, poison := gen.Next()
			if len(opts.Frame) > 0 {
				value = append(opts.Frame[:len(opts.Frame):len(opts.Frame)], value...)
			}
			msg := &kafka.Message{
				TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
				Key:            key,
				Value:          value,
			}
			if poison {
				msg.Opaque = poisonTag
			}
			var span tracing.Send
			if opts.Tracer != nil {
				span = opts.Tracer.StartSend(tracing.Ref{}, topic, nil)
				msg.Headers = span.Inject(msg.Headers)
			}
			err := produceOne(ctx, p, msg)
			span.End(err) // the span covers the hand-over to the client, not the delivery
			if err != nil {
				if ctx.Err() != nil {
					return sent, nil
				}
				return sent, err
			}
			sent++
		}
	}
	return sent, nil
}

// produceOne enqueues msg, waiting for room while librdkafka's queue is
// full. It gives up only when ctx is done or the record is refused for
// another reason.
func produceOne(ctx context.Context, p *kafka.Producer, msg *kafka.Message) error {
	for {
		err := p.Produce(msg, nil)
		if err == nil {
			return nil
		}
		var kerr kafka.Error
		if !errors.As(err, &kerr) || kerr.Code() != kafka.ErrQueueFull {
			return fmt.Errorf("produce %s: %w", msg.Key, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Flush serves delivery reports (the delivery goroutine frees the
		// queue) and returns as soon as the queue is empty or after 10 ms.
		p.Flush(10)
	}
}

// finish flushes p until every delivery report has arrived, bounded by ctx,
// or by drainTimeout when ctx is already done. Records still queued then are
// purged, so their (failed) reports arrive before Close. It returns how many
// records were left.
func finish(ctx context.Context, p *kafka.Producer) int {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
		defer cancel()
	}
	for p.Len() > 0 && ctx.Err() == nil {
		p.Flush(100)
	}
	left := p.Len()
	if left > 0 {
		_ = p.Purge(kafka.PurgeQueue | kafka.PurgeInFlight)
		// Purged records get failed delivery reports; serve them.
		p.Flush(1000)
	}
	return left
}
