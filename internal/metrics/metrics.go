// Package metrics holds ratchet's Prometheus series. Every series is named
// ratchet_*, carries its unit in its name, and is labelled only by bounded
// values (topic, partition, class, result), never by offsets or ids.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the series one engine updates. A nil *Metrics is not valid;
// use New (tests use New(prometheus.NewRegistry())).
type Metrics struct {
	Records         *prometheus.CounterVec   // topic, partition
	Batches         *prometheus.CounterVec   // topic, partition
	BatchSeconds    *prometheus.HistogramVec // topic
	EndToEndSeconds *prometheus.HistogramVec // topic
	Poison          *prometheus.CounterVec   // topic, reason
	Retries         *prometheus.CounterVec   // class
	DeadLetters     *prometheus.CounterVec   // topic
	// RejectedRecords counts records a processor took out of their batch
	// (refused before any statement was sent) and dead-lettered with it;
	// Bisections counts batches split in two to isolate a record only
	// PostgreSQL refused (or one taken out when rejecting fell back).
	RejectedRecords  *prometheus.CounterVec // topic
	Bisections       *prometheus.CounterVec // topic
	Commits          *prometheus.CounterVec // result
	CommittedOffset  *prometheus.GaugeVec   // topic, partition
	StoredOffset     *prometheus.GaugeVec   // topic, partition
	Lag              *prometheus.GaugeVec   // topic, partition
	Paused           prometheus.Gauge
	Assigned         prometheus.Gauge
	AssignmentWait   prometheus.Gauge       // seconds subscribed without an assignment (an empty one counts); 0 with one
	HeldBytes        prometheus.Gauge       // what partition actors hold, against BudgetBytes
	HeldBytesPeak    prometheus.Gauge       // the most HeldBytes so far, at any moment
	BudgetBytes      prometheus.Gauge       // processing.memory_budget
	Restarts         *prometheus.CounterVec // actor
	RewindsPrevented *prometheus.CounterVec // topic
	RewindRecords    *prometheus.CounterVec // topic
	Fenced           *prometheus.CounterVec // topic, reason
	StaleOffsets     prometheus.Counter
	DegradedSeconds  prometheus.Counter
	Reconnects       *prometheus.CounterVec // reason
	OffsetResets     *prometheus.CounterVec // topic
	// CommitsAbandoned counts partitions whose applied offsets were left
	// uncommitted in Kafka when a stop or a revoke ran out of time;
	// UncommittedRecords counts the applied records among them (replayed
	// by the next owner in at-least-once mode; still guarded by the store
	// in exactly-once mode).
	CommitsAbandoned *prometheus.CounterVec // topic
	// Unclaimed is the number of assigned partitions held paused because
	// their claim in the offset store failed (retried with backoff).
	Unclaimed          prometheus.Gauge
	UncommittedRecords *prometheus.CounterVec // topic
	// DecodedRecords counts record values by how they were decoded.
	DecodedRecords *prometheus.CounterVec // topic, format, result
	// RegistryLookups counts schema registry requests answered (found or
	// not_found); RegistryCacheHits the schema ids answered from a cache;
	// RegistryErrors requests that got no usable answer (the registry is
	// unreachable, failing or refusing us).
	RegistryLookups   *prometheus.CounterVec // result
	RegistryCacheHits prometheus.Counter
	RegistryErrors    *prometheus.CounterVec // reason
	// ReplaysSkipped counts records re-produced by `ratchet dlq replay`
	// for another consumer group (header ratchet.replay_group), skipped.
	ReplaysSkipped *prometheus.CounterVec // topic
	// PipelineRecords counts records by configured pipeline and result
	// (written, filtered, ignored, dead_lettered); PipelineRows the rows
	// sent to its table by operation (upserted, deleted, merged, appended). Both
	// count every attempt of a batch that is tried again.
	PipelineRecords *prometheus.CounterVec // pipeline, result
	PipelineRows    *prometheus.CounterVec // pipeline, op
	// PipelineConfigErrors counts the times a pipeline's table began to
	// refuse its statements (a configuration error: the partitions wait,
	// nothing is dead-lettered); PipelineConfigWaiting is how many
	// partitions wait on it now. The label is empty for a processor that
	// is not a configured pipeline.
	PipelineConfigErrors  *prometheus.CounterVec // pipeline
	PipelineConfigWaiting *prometheus.GaugeVec   // pipeline
	// PipelineGuardTripped is 1 for a pipeline whose failure guard
	// tripped: its topic is held until a restart.
	PipelineGuardTripped *prometheus.GaugeVec // pipeline
}

// New registers the series on reg.
func New(reg prometheus.Registerer) *Metrics {
	tp := []string{"topic", "partition"}
	m := &Metrics{
		Records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_records_total", Help: "Records applied (committed to PostgreSQL)."}, tp),
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_batches_total", Help: "Batch transactions committed."}, tp),
		BatchSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ratchet_batch_duration_seconds", Help: "Time to apply one batch transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"topic"}),
		EndToEndSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ratchet_end_to_end_latency_seconds", Help: "Record timestamp to its transaction committed.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"topic"}),
		Poison: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_poison_records_total", Help: "Records that could not be decoded or broke a schema rule."},
			[]string{"topic", "reason"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_retries_total", Help: "Batch retries by error class."}, []string{"class"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_dead_letters_total", Help: "Records written to the dead-letter topic."}, []string{"topic"}),
		RejectedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_rejected_records_total", Help: "Records refused before any statement was sent, dead-lettered with their batch without splitting it."}, []string{"topic"}),
		Bisections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_bisections_total", Help: "Batches split in two to isolate a record the database refused."}, []string{"topic"}),
		Commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_kafka_commits_total", Help: "Kafka offset commit requests by result."}, []string{"result"}),
		CommittedOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratchet_committed_offset", Help: "Last offset committed to Kafka (next to read)."}, tp),
		StoredOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratchet_stored_offset", Help: "Next offset not yet applied, as applied to PostgreSQL."}, tp),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratchet_lag_records", Help: "High watermark minus the applied position."}, tp),
		Paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratchet_paused_partitions", Help: "Partitions paused for backpressure or retries."}),
		Assigned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratchet_assigned_partitions", Help: "Partitions assigned to this instance."}),
		AssignmentWait: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratchet_assignment_wait_seconds",
			Help: "How long this instance has been subscribed without an assignment from the consumer group (since it subscribed or lost its assignment); 0 while it has one, an empty one included. Past 2 × session timeout + shutdown.timeout the consumer is rebuilt (ratchet_consumer_rebuilds_total{reason=\"assignment_wait\"})."}),
		HeldBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratchet_held_bytes", Help: "Bytes of records the partition actors hold (queued, cut ahead, in flight), sampled every second."}),
		HeldBytesPeak: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratchet_held_bytes_peak", Help: "The most bytes of records the partition actors held at any moment since the start (tracked at every hand-over, published every second)."}),
		BudgetBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratchet_memory_budget_bytes", Help: "processing.memory_budget: the most bytes of records the partition actors hold together."}),
		Restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_actor_restarts_total", Help: "Supervised actor restarts."}, []string{"actor"}),
		RewindsPrevented: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_rewinds_prevented_total", Help: "Assignments where Kafka's committed offset was behind the stored one."},
			[]string{"topic"}),
		RewindRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_rewind_records_prevented_total", Help: "Records Kafka's committed offset alone would have replayed."},
			[]string{"topic"}),
		Fenced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_fenced_writes_total", Help: "Batch transactions refused by the offset guard."},
			[]string{"topic", "reason"}),
		StaleOffsets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratchet_stale_offset_reports_total", Help: "Offset reports lower than the known watermark, ignored."}),
		DegradedSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratchet_degraded_seconds_total", Help: "Time spent retrying transient failures."}),
		Reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_consumer_rebuilds_total", Help: "Consumers rebuilt, by reason: fatal (error), brokers_down (outage), recycle (kafka.recycle_interval), assignment_wait (no assignment within 2 × session timeout + shutdown.timeout)."}, []string{"reason"}),
		OffsetResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_offset_resets_total", Help: "Positions past the end of a partition (topic recreated) reset to its start."},
			[]string{"topic"}),
		DecodedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_decoded_records_total",
			Help: "Record values decoded, by format (protobuf, json, raw, custom; +registry when schema registry framed) and result (ok, poison)."},
			[]string{"topic", "format", "result"}),
		RegistryLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_schema_registry_lookups_total", Help: "Schema ids looked up in the schema registry, by answer (found, not_found)."},
			[]string{"result"}),
		RegistryCacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratchet_schema_registry_cache_hits_total", Help: "Schema ids answered from the cache, without a registry request."}),
		RegistryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_schema_registry_errors_total", Help: "Schema registry requests without a usable answer, by reason (unreachable, server_error, refused, unexpected_answer)."},
			[]string{"reason"}),
		Unclaimed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratchet_unclaimed_partitions",
			Help: "Assigned partitions held paused because their start could not be read (committed offset, log bounds) or claimed in the offset store; retried with backoff."}),
		CommitsAbandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_commits_abandoned_total",
			Help: "Partitions whose applied offsets were left uncommitted in Kafka at a stop or revoke deadline, or by a lost assignment."},
			[]string{"topic"}),
		UncommittedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratchet_uncommitted_records_total",
			Help: "Applied records whose offsets were left uncommitted in Kafka at a stop or revoke deadline, or by a lost assignment; in at-least-once mode also the records of a batch whose COMMIT went unanswered and is applied again."},
			[]string{"topic"}),
	}
	m.ReplaysSkipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratchet_replays_skipped_total",
		Help: "Records replayed from a dead-letter topic for another consumer group (ratchet.replay_group), skipped: not applied, offset passed."},
		[]string{"topic"})
	reg.MustRegister(m.ReplaysSkipped)
	m.PipelineRecords = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratchet_pipeline_records_total",
		Help: "Records by configured pipeline and result (written, filtered, ignored, dead_lettered); a batch tried again counts again."},
		[]string{"pipeline", "result"})
	m.PipelineRows = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratchet_pipeline_rows_total",
		Help: "Rows a configured pipeline sent to its table, by operation (upserted, deleted, merged, appended); a batch tried again counts again."},
		[]string{"pipeline", "op"})
	reg.MustRegister(m.PipelineRecords, m.PipelineRows)
	m.PipelineConfigErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratchet_pipeline_config_errors_total",
		Help: "Times a pipeline's table began to refuse its statements whatever the records (a configuration error: its partitions wait, nothing is dead-lettered)."},
		[]string{"pipeline"})
	m.PipelineConfigWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ratchet_pipeline_config_error_partitions",
		Help: "Partitions waiting on a configuration error of a pipeline's table."},
		[]string{"pipeline"})
	m.PipelineGuardTripped = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ratchet_pipeline_guard_tripped",
		Help: "1 when a pipeline's failure guard tripped (too many of its records failed): its topic is held until a restart."},
		[]string{"pipeline"})
	reg.MustRegister(m.PipelineConfigErrors, m.PipelineConfigWaiting, m.PipelineGuardTripped)
	reg.MustRegister(m.DecodedRecords, m.RegistryLookups, m.RegistryCacheHits, m.RegistryErrors)
	reg.MustRegister(m.Unclaimed, m.CommitsAbandoned, m.UncommittedRecords, m.OffsetResets, m.Records, m.Batches, m.BatchSeconds, m.EndToEndSeconds, m.Poison, m.Retries,
		m.DeadLetters, m.RejectedRecords, m.Bisections, m.Commits, m.CommittedOffset, m.StoredOffset, m.Lag, m.Paused, m.Assigned, m.AssignmentWait, m.HeldBytes, m.HeldBytesPeak, m.BudgetBytes,
		m.Restarts, m.RewindsPrevented, m.RewindRecords, m.Fenced, m.StaleOffsets, m.DegradedSeconds, m.Reconnects)
	return m
}

// NewRegistry returns a registry with the Go and process collectors and the
// engine's series.
func NewRegistry() (*prometheus.Registry, *Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, New(reg)
}

// Partition formats a partition number as a label value.
func Partition(p int32) string { return strconv.FormatInt(int64(p), 10) }
