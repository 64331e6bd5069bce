// Package kafkaclient builds the confluent-kafka-go clients ratchet uses,
// with the settings its guarantees depend on, and routes librdkafka's own
// log lines into slog.
package kafkaclient

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// ConsumerOptions are the inputs of NewConsumer.
type ConsumerOptions struct {
	Brokers         []string
	GroupID         string
	InstanceID      string // group.instance.id (static membership); empty for dynamic
	AutoOffsetReset string // earliest or latest; only for partitions with no offset at all
	Properties      map[string]string
	// Partitions is how many partitions the input topics have in all (0
	// when unknown); it sizes fetch.wait.max.ms (FetchWaitMs).
	Partitions int
}

// FetchWaitMs is the default fetch.wait.max.ms of a consumer whose input
// topics have partitions partitions: 100 ms up to 512 partitions, then
// growing with them (200 ms at 1024), at most 500 ms.
//
// It is how long the broker holds a fetch that finds nothing. An idle
// instance sends one fetch per expiry naming every assigned partition, and
// librdkafka's broker thread spends about a microsecond on each partition
// of each request and response: owning 1024 partitions, idle, 1.9-2.2 % of
// a core at 100 ms against 1.4-1.5 % at 200 (librdkafka's thread 1.1 % at
// 100 ms, the rest the Go side). Scaling the wait keeps that cost at what
// 512 partitions cost at 100 ms.
//
// It stays at 100 ms below that because the wait is also a latency: with
// one fetch in flight per broker, a partition left out of a fetch that
// finds little waits for it to expire (after librdkafka's queue-full
// back-off, only the partitions whose back-off ended first are fetched).
// At 300 ms the latency run's (12 partitions) p99 was 208 ms against 39.5
// ms at 100 ms; at 500 ms the drain of 1024 partitions lost a third of its
// rate, at 200 ms a few per cent (issue 18, bench/findings.md). Set
// fetch.wait.max.ms in kafka.properties to choose otherwise.
func FetchWaitMs(partitions int) int {
	return min(max(100, partitions*100/512), 500)
}

// ConsumerConfig returns the librdkafka configuration for o; producer-only
// properties of o.Properties are left out. The settings below are not
// negotiable (config validation refuses overrides):
//
//   - enable.auto.commit=false and enable.auto.offset.store=false: only the
//     committer commits, and only offsets that were applied. With the
//     defaults Close() commits prefetched records nobody processed.
//   - partition.assignment.strategy=cooperative-sticky: partitions that stay
//     with a member through a rebalance are never revoked, so they never
//     rewind to the last commit.
func ConsumerConfig(o ConsumerOptions) *kafka.ConfigMap {
	reset := o.AutoOffsetReset
	if reset == "" {
		reset = "earliest"
	}
	m := kafka.ConfigMap{
		// Defaults a user may override.
		"socket.timeout.ms":     10000,
		"session.timeout.ms":    30000,
		"heartbeat.interval.ms": 3000,
		// queued.max.messages.kbytes bounds the prefetch of the whole
		// consumer (one queue for all partitions), and librdkafka caps a
		// fetch request at it. Each partition may return up to
		// max.partition.fetch.bytes of a fetch, so with librdkafka's 1 MiB
		// a 2 MiB bound let two partitions fill every fetch: a backlog was
		// drained two partitions at a time while the other partition
		// actors waited. 128 KiB a partition lets 16 partitions share one
		// fetch. The bound stays at 2 MiB instead of librdkafka's 64 MiB
		// (at 8 MiB a 2,000,000-record drain peaked at 213 MiB RSS against
		// 161 MiB); refills come after a 20 ms back-off instead of the
		// default second (make bench, TestBacklogFetchReachesEveryPartition).
		//
		// fetch.wait.max.ms: see FetchWaitMs.
		"queued.max.messages.kbytes":         2048,
		"max.partition.fetch.bytes":          131072,
		"fetch.queue.backoff.ms":             20,
		"fetch.wait.max.ms":                  FetchWaitMs(o.Partitions),
		"topic.metadata.refresh.interval.ms": 30000,
	}
	for k, v := range ForConsumer(o.Properties) {
		m[k] = v
	}
	fixed := kafka.ConfigMap{
		"bootstrap.servers":             strings.Join(o.Brokers, ","),
		"group.id":                      o.GroupID,
		"enable.auto.commit":            false,
		"enable.auto.offset.store":      false,
		"partition.assignment.strategy": "cooperative-sticky",
		"auto.offset.reset":             reset,
		"enable.partition.eof":          false,
		"go.logs.channel.enable":        true,
	}
	for k, v := range fixed {
		m[k] = v
	}
	if o.InstanceID != "" {
		m["group.instance.id"] = o.InstanceID
	}
	return &m
}

// NewConsumer creates a consumer for o and starts forwarding its log lines
// to log. The forwarding goroutine ends when the consumer is closed (Close
// closes the logs channel).
func NewConsumer(o ConsumerOptions, log *slog.Logger) (*kafka.Consumer, error) {
	c, err := kafka.NewConsumer(ConsumerConfig(o))
	if err != nil {
		return nil, fmt.Errorf("new kafka consumer: %w", err)
	}
	go ForwardLogs(c.Logs(), log.With("client", "consumer"))
	return c, nil
}

// ProducerConfig returns the librdkafka configuration of the DLQ and demo
// producers: idempotent, all in-sync replicas, so a delivery report means the
// record is durable. Consumer-only properties of props are left out.
func ProducerConfig(brokers []string, props map[string]string) *kafka.ConfigMap {
	m := kafka.ConfigMap{
		"linger.ms":                    5,
		"compression.type":             "lz4",
		"queue.buffering.max.messages": 1000000,
		// confluent-kafka-go allocates both Go channels at full size up
		// front: at their defaults of 1,000,000 entries that is 24 MB of
		// heap the collector scans on every cycle. Delivery reports are
		// read as they come, and ProduceChannel is not used.
		"go.events.channel.size":  10000,
		"go.produce.channel.size": 1000,
	}
	for k, v := range ForProducer(props) {
		m[k] = v
	}
	m["bootstrap.servers"] = strings.Join(brokers, ",")
	m["enable.idempotence"] = true
	m["acks"] = "all"
	m["go.logs.channel.enable"] = true
	return &m
}

// NewProducer creates a producer and forwards its log lines to log until it
// is closed.
func NewProducer(brokers []string, props map[string]string, log *slog.Logger) (*kafka.Producer, error) {
	p, err := kafka.NewProducer(ProducerConfig(brokers, props))
	if err != nil {
		return nil, fmt.Errorf("new kafka producer: %w", err)
	}
	go ForwardLogs(p.Logs(), log.With("client", "producer"))
	return p, nil
}

// consumerOnly are the properties only a consumer reads: those librdkafka
// 2.11.1 marks C in its CONFIGURATION.md (rd_kafka_conf_properties_show of
// the bundled library, callbacks left out), and confluent-kafka-go's own
// consumer settings. Given to a producer, librdkafka warns at every start
// that it ignores them ("Configuration property session.timeout.ms is a
// consumer property and will be ignored by this producer instance"), and a
// go.* setting of the other client type is refused.
var consumerOnly = names(
	"group.id", "group.instance.id", "group.protocol", "group.protocol.type", "group.remote.assignor",
	"partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms",
	"coordinator.query.interval.ms", "max.poll.interval.ms",
	"enable.auto.commit", "auto.commit.enable", "auto.commit.interval.ms", "enable.auto.offset.store",
	"auto.offset.reset", "offset.store.method", "offset.store.path", "offset.store.sync.interval.ms",
	"queued.min.messages", "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.queue.backoff.ms",
	"fetch.message.max.bytes", "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes",
	"fetch.error.backoff.ms", "isolation.level", "enable.partition.eof", "check.crcs",
	"consume.callback.max.messages",
	"go.application.rebalance.enable", "go.events.channel.enable",
)

// producerOnly are the properties only a producer reads (P in librdkafka's
// CONFIGURATION.md, and confluent-kafka-go's producer settings); a consumer
// warns that it ignores them.
var producerOnly = names(
	"transactional.id", "transaction.timeout.ms", "enable.idempotence", "enable.gapless.guarantee",
	"queue.buffering.max.messages", "queue.buffering.max.kbytes", "queue.buffering.max.ms", "linger.ms",
	"queue.buffering.backpressure.threshold", "message.send.max.retries", "retries",
	"batch.num.messages", "batch.size", "compression.codec", "compression.type", "compression.level",
	"delivery.report.only.error", "sticky.partitioning.linger.ms", "request.required.acks", "acks",
	"request.timeout.ms", "message.timeout.ms", "delivery.timeout.ms", "queuing.strategy",
	"produce.offset.report", "partitioner",
	"go.batch.producer", "go.delivery.reports", "go.delivery.report.fields", "go.produce.channel.size",
)

func names(list ...string) map[string]bool {
	m := make(map[string]bool, len(list))
	for _, n := range list {
		m[n] = true
	}
	return m
}

// ConsumerOnly reports whether the librdkafka property name is read by
// consumers only.
func ConsumerOnly(name string) bool { return consumerOnly[name] }

// ProducerOnly reports whether the librdkafka property name is read by
// producers only.
func ProducerOnly(name string) bool { return producerOnly[name] }

// ForConsumer returns the kafka.properties a consumer (and an admin client
// made from it) is given: all but the producer-only ones.
func ForConsumer(props map[string]string) map[string]string { return without(props, producerOnly) }

// ForProducer returns the kafka.properties a producer (and an admin client
// made from it) is given: all but the consumer-only ones.
func ForProducer(props map[string]string) map[string]string { return without(props, consumerOnly) }

func without(props map[string]string, drop map[string]bool) map[string]string {
	out := make(map[string]string, len(props))
	for k, v := range props {
		if !drop[k] {
			out[k] = v
		}
	}
	return out
}

// ForwardLogs writes librdkafka's log lines from ch to log, at LogLevel,
// until ch is closed (the client's Close closes it). librdkafka blocks on
// a full logs channel, so it must always be drained: run it on a goroutine
// of its own for the client's whole life.
func ForwardLogs(ch chan kafka.LogEvent, log *slog.Logger) {
	for ev := range ch {
		log.Log(context.Background(), LogLevel(ev), "librdkafka", "tag", ev.Tag, "name", ev.Name, "message", ev.Message)
	}
}

// LogLevel is the slog level of one librdkafka log line: by its syslog
// level, errors (0-3) at error, warnings (4) at warn, notices and
// information (5, 6) at info, debug (7) at debug; with two exceptions:
//
//   - connection failures (tags FAIL and ERROR) are at warn, not error:
//     librdkafka reconnects by itself, and Poll reports them again as
//     kafka.Error, where the supervisor decides what they mean;
//   - a notice or information line in quiet says nothing an operator
//     can act on and goes to debug. Warnings and errors never do.
func LogLevel(ev kafka.LogEvent) slog.Level {
	switch {
	case ev.Level <= 3: // emerg, alert, crit, err
		if ev.Tag == "FAIL" || ev.Tag == "ERROR" {
			return slog.LevelWarn
		}
		return slog.LevelError
	case ev.Level == 4: // warning
		return slog.LevelWarn
	case ev.Level <= 6: // notice, info
		if isQuiet(ev) {
			return slog.LevelDebug
		}
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// quiet lists librdkafka's notice and information lines that say nothing
// an operator can act on, by tag (facility) and a part of the message;
// an empty tag matches every tag, an empty part every message.
var quiet = []struct{ tag, part string }{
	// KIP-714 client telemetry: "Telemetry client instance id changed
	// from AAAAAAAAAAAAAAAAAAAAAA to ..." at every start of every client,
	// from brokers that support telemetry subscriptions (kfake does).
	{"GETSUBSCRIPTIONS", ""},
	{"PUSHTELEMETRY", ""},
	{"TELEMETRY", ""},
	{"", "Telemetry client instance id changed"},
}

func isQuiet(ev kafka.LogEvent) bool {
	for _, q := range quiet {
		if (q.tag == "" || ev.Tag == q.tag) && strings.Contains(ev.Message, q.part) {
			return true
		}
	}
	return false
}
