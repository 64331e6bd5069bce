package config

import (
	"fmt"
	"strings"
)

// KeyDoc documents one configuration key: its YAML name, its environment
// variable, its default as Default has it, and what it means.
type KeyDoc struct {
	Key, Env, Default, Meaning string
}

// key binds one configuration key to its field. This one table drives the
// YAML and environment overlays, the redacted rendering and the reference
// documentation, so they cannot drift apart. field returns a pointer to the
// field inside c; its type selects how text is parsed and printed (see
// setText and show).
type key struct {
	name    string
	meaning string
	field   func(c *Config) any
}

// keys lists every key in the order of the reference table.
var keys = []key{
	{"kafka.brokers", "bootstrap servers, host:port", func(c *Config) any { return &c.Kafka.Brokers }},
	{"kafka.group_id", "consumer group", func(c *Config) any { return &c.Kafka.GroupID }},
	{"kafka.topics", "input topics", func(c *Config) any { return &c.Kafka.Topics }},
	{"kafka.format", "value format of the input: protobuf or json (ratchet.v1.Event), or raw (undecoded bytes, for a custom processor; the dashboard refuses it)", func(c *Config) any { return &c.Kafka.Format }},
	{"kafka.topic_formats", "per-topic format override, topic=format", func(c *Config) any { return &c.Kafka.TopicFormats }},
	{"kafka.dlq_topic", "dead-letter topic; empty means `<topic>.dlq`", func(c *Config) any { return &c.Kafka.DLQTopicName }},
	{"kafka.instance_id", "static membership (group.instance.id), e.g. the pod name", func(c *Config) any { return &c.Kafka.InstanceID }},
	{"kafka.properties", "extra librdkafka properties (TLS, SASL, ...)", func(c *Config) any { return &c.Kafka.Properties }},
	{"kafka.recycle_interval", "rebuild the consumer this often, after a drain and flush; 0 is off", func(c *Config) any { return &c.Kafka.RecycleInterval }},
	{"kafka.auto_offset_reset", "start of a partition with no stored or committed offset: earliest or latest", func(c *Config) any { return &c.Kafka.AutoOffsetReset }},
	{"postgres.url", "a postgres:// or postgresql:// URL; its password is never printed; may point at a transaction-mode pooler (PgBouncer, pgcat, RDS Proxy) unchanged: nothing in ratchet depends on a database session (docs/operations.md, Behind a pooler); a default_query_exec_mode in it wins over ratchet's pick (cache_describe behind a pooler, cache_statement on a direct connection)", func(c *Config) any { return &c.Postgres.URL }},
	{"postgres.max_conns", "pool size; 0 means the input topics' partitions + 4, at most 16 (raise it for a PostgreSQL with more than 8 cores and a processor that waits inside its transaction)", func(c *Config) any { return &c.Postgres.MaxConns }},
	{"postgres.synchronous_commit", "on, or off: exactly-once commits do not wait for the WAL flush (a PostgreSQL crash may undo the last ones, results and offsets together; they are applied again)", func(c *Config) any { return &c.Postgres.SynchronousCommit }},
	{"processing.batch_size", "records per transaction while the partition keeps up (fewer when processing.batch_linger ends the wait first)", func(c *Config) any { return &c.Processing.BatchSize }},
	{"processing.max_batch_size", "records per transaction when the partition is behind (more than processing.batch_size queued): fewer transactions, COMMITs and offset advances for a backlog; 0 means 4 × processing.batch_size (at most 100000); processing.batch_size turns the growth off", func(c *Config) any { return &c.Processing.MaxBatchSize }},
	{"processing.batch_linger", "max wait to fill a batch", func(c *Config) any { return &c.Processing.BatchLinger }},
	{"processing.max_buffered_per_partition", "the most records one partition holds, even with processing.memory_budget to spare (bounds what a slow or stuck partition keeps); above it the partition is paused", func(c *Config) any { return &c.Processing.MaxBufferedPerPartition }},
	{"processing.memory_budget", "bytes of records (key, value, headers and 512 bytes each for their structures) all partitions of the instance hold together, queued, in batches cut ahead or in flight, dead letters included; half of it is reserved, budget / (2 × partitions) for each partition whatever the others hold, so partitions that stop applying never starve those that apply; one partition takes at most max(budget / partitions, budget / 8); see Sizing in deploy/README.md", func(c *Config) any { return &c.Processing.MemoryBudget }},
	{"commit.mode", "exactly-once or at-least-once", func(c *Config) any { return &c.Commit.Mode }},
	{"commit.interval", "Kafka commit cadence (coalesced)", func(c *Config) any { return &c.Commit.Interval }},
	{"retry.initial_backoff", "first retry wait", func(c *Config) any { return &c.Retry.InitialBackoff }},
	{"retry.max_backoff", "longest retry wait", func(c *Config) any { return &c.Retry.MaxBackoff }},
	{"retry.max_attempts", "attempts for a record before the DLQ", func(c *Config) any { return &c.Retry.MaxAttempts }},
	{"supervision.max_restarts", "restarts of a partition actor allowed within supervision.within", func(c *Config) any { return &c.Supervision.MaxRestarts }},
	{"supervision.within", "window of the restart budget", func(c *Config) any { return &c.Supervision.Within }},
	{"http.addr", "metrics, health and the page; port 0: any free port; empty: off", func(c *Config) any { return &c.HTTP.Addr }},
	{"shutdown.timeout", "drain limit on stop", func(c *Config) any { return &c.Shutdown.Timeout }},
	{"startup.timeout", "how long a start retries an unreachable PostgreSQL or Kafka (WARN per attempt, /readyz 503) before exit 1 naming it; 0: forever", func(c *Config) any { return &c.Startup.Timeout }},
	{"log.level", "debug, info, warn or error", func(c *Config) any { return &c.Log.Level }},
	{"log.format", "json or text", func(c *Config) any { return &c.Log.Format }},
	{"log.dead_letters", "how dead letters are logged: each (a WARN line per record), summary (the first of each topic and reason in full, then one line per topic and reason at most every log.dead_letter_interval with the count and the offsets) or off; the DLQ record and the metrics keep every detail (docs/operations.md, Logs)", func(c *Config) any { return &c.Log.DeadLetters }},
	{"log.dead_letter_interval", "shortest time between two summary lines of one topic and reason (log.dead_letters summary)", func(c *Config) any { return &c.Log.DeadLetterInterval }},
	{"log.include_values", "let the reasons of dead letters reach the log, the traces and the page with the record values they quote; false: those values are shown as … (the dead letter's ratchet.error header keeps the full text either way)", func(c *Config) any { return &c.Log.IncludeValues }},
	{"schema_registry.url", "Confluent Schema Registry, http(s)://host:port; when set, protobuf and json values are in its wire format (magic byte, schema id) and schema ids are looked up there; empty: off", func(c *Config) any { return &c.SchemaRegistry.URL }},
	{"schema_registry.username", "basic-auth user of the registry (e.g. an API key); never printed", func(c *Config) any { return &c.SchemaRegistry.Username }},
	{"schema_registry.password", "basic-auth password of the registry (e.g. an API secret); never printed", func(c *Config) any { return &c.SchemaRegistry.Password }},
	{"tracing.enabled", "export OpenTelemetry traces (a span per batch, its transaction, dead letters, commits, stops and rebalances); where to and how many come from the standard OTEL_* variables (docs/operations.md, Tracing); false: nothing is recorded or exported", func(c *Config) any { return &c.Tracing.Enabled }},
}

// env returns the environment variable of k: RATCHET_ and the key in upper
// case with dots as underscores.
func (k key) env() string {
	return "RATCHET_" + strings.ToUpper(strings.ReplaceAll(k.name, ".", "_"))
}

// section returns the part of the key before the dot.
func (k key) section() string {
	s, _, _ := strings.Cut(k.name, ".")
	return s
}

// lookup returns the key called name.
func lookup(name string) (key, bool) {
	for _, k := range keys {
		if k.name == name {
			return k, true
		}
	}
	return key{}, false
}

// Reference documents every key, in a stable order (the order of the
// table in docs/configuration.md), with its default rendered from Default so the
// documentation cannot drift from the code.
func Reference() []KeyDoc {
	d := Default()
	out := make([]KeyDoc, len(keys))
	for i, k := range keys {
		def := show(k.field(&d))
		if def == "" {
			def = "(empty)"
		}
		out[i] = KeyDoc{Key: k.name, Env: k.env(), Default: def, Meaning: k.meaning}
	}
	return out
}

// ReferenceMarkdown renders Reference as the Markdown table
// docs/configuration.md embeds between <!-- config-reference:begin --> and
// <!-- config-reference:end -->.
func ReferenceMarkdown() string {
	var b strings.Builder
	b.WriteString("| key | environment | default | meaning |\n|---|---|---|---|\n")
	for _, k := range Reference() {
		fmt.Fprintf(&b, "| `%s` | `%s` | `%s` | %s |\n", k.Key, k.Env, k.Default, k.Meaning)
	}
	return b.String()
}
