package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/event"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/metrics"
	"ratchet/internal/produce"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// drainResult is one timed drain of a backlog.
type drainResult struct {
	Events int64
	Wall   time.Duration // from start (subscribe / engine.Run) to the last record
	Steady time.Duration // from the first record seen to the last
	// TxBusy is the time spent in batch transactions, summed over the
	// partitions (ratchet_batch_duration_seconds); TxBusy/Steady is how
	// many partitions were inside a transaction on average.
	TxBusy time.Duration
	// CPU is the CPU in use from the first record to the last.
	CPU cpuUse
	// Batches is how many batch transactions ran (the sample count of
	// ratchet_batch_duration_seconds); 0 for a loop that is not ratchet.
	Batches int64
}

// Rate is events per second from the first record to the last, so group
// join time is not counted.
func (r drainResult) Rate() float64 {
	if r.Steady <= 0 {
		return 0
	}
	return float64(r.Events) / r.Steady.Seconds()
}

// preload writes n events to topic as fast as the producer goes.
func preload(ctx context.Context, brokers []string, topic string, n int64, seed int64, log *slog.Logger) (time.Duration, error) {
	start := time.Now()
	st, err := produce.Run(ctx, produce.Options{Brokers: brokers, Topic: topic, Rate: 0, Count: n, Seed: seed}, log)
	if err != nil {
		return 0, fmt.Errorf("preload %s: %w", topic, err)
	}
	if st.Produced != n {
		return 0, fmt.Errorf("preload %s: %d of %d delivered", topic, st.Produced, n)
	}
	return time.Since(start), nil
}

// cpuPerMillion is the machine's CPU time, in seconds, that a million
// events took.
func (r drainResult) cpuPerMillion() float64 {
	if r.Events <= 0 {
		return 0
	}
	return r.CPU.machine * r.Steady.Seconds() / float64(r.Events) * 1e6
}

// cpuLine says how many cores were busy during the drain, and where.
func (r drainResult) cpuLine() string {
	u := r.CPU
	line := fmt.Sprintf("CPU %.2f cores (this process %.2f, broker %.2f, rest %.2f), %.2f CPU-s per million events",
		u.machine, u.self, u.broker, u.rest(), r.cpuPerMillion())
	if r.Batches > 0 {
		line += fmt.Sprintf(", %d batches (%.0f records each), %.1f partitions in a transaction on average", r.Batches, float64(r.Events)/float64(r.Batches), r.inTx())
	}
	return line
}

// drainCeiling drains topic with a bare Poll loop: ratchet's consumer
// settings, no auto commit, nothing written. With decode set every record
// also goes through ratchet's decoder (protobuf), the work any consumer
// that checks its input does, the engine included.
func drainCeiling(ctx context.Context, env *benchEnv, topic, group string, n int64, decode bool) (drainResult, error) {
	m := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Brokers: env.brokers, GroupID: group})
	_ = m.SetKey("go.logs.channel.enable", false)
	_ = m.SetKey("log_level", 3)
	c, err := kafka.NewConsumer(m)
	if err != nil {
		return drainResult{}, fmt.Errorf("ceiling consumer: %w", err)
	}
	defer c.Close()
	start := time.Now()
	if err := c.SubscribeTopics([]string{topic}, nil); err != nil {
		return drainResult{}, fmt.Errorf("subscribe: %w", err)
	}
	var dec *event.Decoder
	if decode {
		dec = event.NewDecoder(event.FormatProtobuf)
	}
	var got, bad int64
	var first time.Time
	var cpu0 cpuSample
	deadline := time.Now().Add(10 * time.Minute)
	for got < n {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return drainResult{}, fmt.Errorf("ceiling: %d of %d after %s", got, n, time.Since(start))
		}
		switch ev := c.Poll(100).(type) {
		case *kafka.Message:
			if got == 0 {
				first, cpu0 = time.Now(), sampleCPU(env.brokerPID)
			}
			got++
			if dec != nil {
				if _, err := dec.Decode(ev.Value); err != nil {
					bad++
				}
			}
		case kafka.Error:
			if ev.IsFatal() {
				return drainResult{}, fmt.Errorf("ceiling: %w", ev)
			}
		}
	}
	end, cpu := time.Now(), sampleCPU(env.brokerPID).since(cpu0)
	if bad > 0 {
		return drainResult{}, fmt.Errorf("ceiling: %d of %d records did not decode", bad, got)
	}
	return drainResult{Events: got, Wall: end.Sub(start), Steady: end.Sub(first), CPU: cpu}, nil
}

// noop is the at-least-once no-op processor.
var noop = processor.Func{ProcessorName: "noop", Fn: func(context.Context, pgx.Tx, processor.Batch) error { return nil }}

// engineConfig is the default configuration pointed at the bench broker and
// database, with the HTTP server off.
func engineConfig(brokers []string, dbURL, topic, group, mode string) config.Config {
	cfg := config.Default()
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.GroupID = group
	cfg.Kafka.Topics = []string{topic}
	cfg.Postgres.URL = config.SecretURL(withApp(dbURL, engineApp))
	cfg.HTTP.Addr = ""
	cfg.Commit.Mode = mode
	return cfg
}

// config is engineConfig for this run's broker and database, with the
// run's overrides.
func (e *benchEnv) config(brokers []string, topic, group, mode string) config.Config {
	cfg := engineConfig(brokers, e.db.url, topic, group, mode)
	if e.maxBuffered > 0 {
		cfg.Processing.MaxBufferedPerPartition = e.maxBuffered
	}
	return cfg
}

// runningEngine is an in-process engine with its own metrics registry.
type runningEngine struct {
	reg *prometheus.Registry
	// records is the engine's ratchet_records_total collector, found once
	// it has a series (see recordsTotal).
	records prometheus.Collector
	cancel  context.CancelFunc
	done    chan error
	start   time.Time
}

func startEngine(ctx context.Context, cfg config.Config, proc processor.Processor, log *slog.Logger) *runningEngine {
	return startEngineWith(ctx, cfg, proc, log, nil)
}

// startEngineWith is startEngine with the engine's options changed by
// opts (nil: none).
func startEngineWith(ctx context.Context, cfg config.Config, proc processor.Processor, log *slog.Logger, opts func(*engine.Options)) *runningEngine {
	ctx, cancel := context.WithCancel(ctx)
	e := &runningEngine{reg: prometheus.NewRegistry(), cancel: cancel, done: make(chan error, 1), start: time.Now()}
	o := engine.Options{Processor: proc, Logger: log, Registry: e.reg, Owner: "bench"}
	if opts != nil {
		opts(&o)
	}
	go func() { // ends when stop cancels ctx and the engine has drained
		e.done <- engine.Run(ctx, cfg, o)
	}()
	return e
}

// counter sums a family of the engine's registry: counter and gauge
// values, histogram sample sums.
func (e *runningEngine) counter(name string) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += m.Histogram.GetSampleSum()
			}
		}
	}
	return sum
}

// recordsTotal is ratchet_records_total. Until the family has a series it
// is read by gathering the registry; from then on from the engine's own
// collector alone, found by registering an equal one (the registry answers
// with the collector it holds). Gathering every family 200 times a second
// cost the engine's process 2-4 % of its CPU in the drains of (l), work
// that a scrape every few seconds never does, while the Poll loops count
// with a plain integer.
func (e *runningEngine) recordsTotal() float64 {
	if e.records != nil {
		ch := make(chan prometheus.Metric, 16)
		go func() { // ends when Collect has sent every series
			e.records.Collect(ch)
			close(ch)
		}()
		var sum float64
		for m := range ch {
			var d dto.Metric
			if m.Write(&d) == nil {
				sum += d.GetCounter().GetValue()
			}
		}
		return sum
	}
	n := e.counter("ratchet_records_total")
	if n > 0 {
		probe := metrics.New(prometheus.NewRegistry()).Records
		var are prometheus.AlreadyRegisteredError
		switch err := e.reg.Register(probe); {
		case errors.As(err, &are):
			e.records = are.ExistingCollector
		case err == nil:
			e.reg.Unregister(probe) // not the engine's: keep gathering
		}
	}
	return n
}

// waitRecords waits until ratchet_records_total reaches n; it returns when
// the first record and the n-th were seen, and the CPU in use between.
func (e *runningEngine) waitRecords(ctx context.Context, n int64, timeout time.Duration, brokerPID int) (first, last time.Time, cpu cpuUse, err error) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(timeout)
	var cpu0 cpuSample
	for {
		select {
		case err := <-e.done:
			e.done <- err
			return first, last, cpu, fmt.Errorf("engine stopped early: %v", err)
		case <-ctx.Done():
			return first, last, cpu, ctx.Err()
		case now := <-t.C:
			got := int64(e.recordsTotal())
			if got > 0 && first.IsZero() {
				first, cpu0 = now, sampleCPU(brokerPID)
			}
			if got >= n {
				return first, now, sampleCPU(brokerPID).since(cpu0), nil
			}
			if now.After(deadline) {
				return first, last, cpu, fmt.Errorf("%d of %d records after %s", got, n, timeout)
			}
		}
	}
}

func (e *runningEngine) stop() error {
	e.cancel()
	select {
	case err := <-e.done:
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	case <-time.After(60 * time.Second):
		return errors.New("engine did not stop within 60s")
	}
}

// writeAllocs writes the allocs profile to path; a failure only loses the
// profile.
func writeAllocs(path string) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	_ = pprof.Lookup("allocs").WriteTo(f, 0)
}

// profiled runs f under a CPU profile written to path, with the allocs
// profile written before and after it (go tool pprof -base
// path.allocs.base path.allocs).
func profiled(path string, f func() error) error {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	writeAllocs(path + ".allocs.base")
	err = f()
	pprof.StopCPUProfile()
	writeAllocs(path + ".allocs")
	return err
}

// drainRatchet drains topic with the in-process engine in mode with proc
// until every record was applied. With profile set it writes a CPU profile
// of the drain there (and allocs profiles, see profiled).
func drainRatchet(ctx context.Context, env *benchEnv, topic, group, mode string, proc processor.Processor, n int64, profile string, tweaks ...func(*config.Config)) (drainResult, error) {
	if profile != "" {
		var d drainResult
		err := profiled(profile, func() (err error) {
			d, err = drainRatchet(ctx, env, topic, group, mode, proc, n, "", tweaks...)
			return err
		})
		return d, err
	}
	cfg := env.config(env.brokers, topic, group, mode)
	for _, t := range tweaks {
		t(&cfg)
	}
	e := startEngine(ctx, cfg, proc, env.engineLog)
	first, last, cpu, err := e.waitRecords(ctx, n, 10*time.Minute, env.brokerPID)
	busy := e.histogramSum("ratchet_batch_duration_seconds")
	batches := e.histogramCount("ratchet_batch_duration_seconds")
	if serr := e.stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return drainResult{}, fmt.Errorf("ratchet %s: %w", mode, err)
	}
	return drainResult{Events: n, Wall: last.Sub(e.start), Steady: last.Sub(first), TxBusy: busy, CPU: cpu, Batches: batches}, nil
}

// histogramSum adds up the sample sums of a histogram family (seconds).
func (e *runningEngine) histogramSum(name string) time.Duration {
	return time.Duration(e.counter(name) * float64(time.Second))
}

// histogramCount adds up the sample counts of a histogram family.
func (e *runningEngine) histogramCount(name string) int64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		return 0
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return int64(n)
}

// inTx is how many partitions were inside a batch transaction on average.
func (r drainResult) inTx() float64 {
	if r.Steady <= 0 {
		return 0
	}
	return r.TxBusy.Seconds() / r.Steady.Seconds()
}

// rollupCount returns sum(count) of dashboard_rollups.
func rollupCount(ctx context.Context, env *benchEnv) (int64, error) {
	var n int64
	err := env.db.pool.QueryRow(ctx, "SELECT coalesce(sum(count),0)::bigint FROM dashboard_rollups").Scan(&n)
	return n, err
}

const naiveSchema = `CREATE TABLE IF NOT EXISTS naive_rollups (
	metric text NOT NULL, bucket timestamptz NOT NULL, count bigint NOT NULL, sum double precision NOT NULL,
	PRIMARY KEY (metric, bucket))`

const naiveUpsert = `INSERT INTO naive_rollups AS r (metric, bucket, count, sum) VALUES ($1, $2, 1, $3)
	ON CONFLICT (metric, bucket) DO UPDATE SET count = r.count + 1, sum = r.sum + EXCLUDED.sum`

// naiveConfig is what a hand-written consumer uses: librdkafka's defaults
// (auto commit, auto offset store) and earliest.
func naiveConfig(brokers []string, group, instanceID string) *kafka.ConfigMap {
	m := &kafka.ConfigMap{
		"bootstrap.servers":  brokers[0],
		"group.id":           group,
		"auto.offset.reset":  "earliest",
		"enable.auto.commit": true,
		"log_level":          3,
	}
	if instanceID != "" {
		_ = m.SetKey("group.instance.id", instanceID)
	}
	return m
}

// drainNaive runs the naive loop for d from its first record: Poll, decode,
// one autocommit upsert per record.
func drainNaive(ctx context.Context, env *benchEnv, topic, group string, d time.Duration) (drainResult, error) {
	conn, err := pgx.Connect(ctx, env.db.url)
	if err != nil {
		return drainResult{}, fmt.Errorf("naive connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, naiveSchema); err != nil {
		return drainResult{}, fmt.Errorf("naive schema: %w", err)
	}
	c, err := kafka.NewConsumer(naiveConfig(env.brokers, group, ""))
	if err != nil {
		return drainResult{}, fmt.Errorf("naive consumer: %w", err)
	}
	defer c.Close()
	start := time.Now()
	if err := c.SubscribeTopics([]string{topic}, nil); err != nil {
		return drainResult{}, fmt.Errorf("subscribe: %w", err)
	}
	var got int64
	var first time.Time
	for first.IsZero() || time.Since(first) < d {
		if ctx.Err() != nil || time.Since(start) > d+2*time.Minute {
			return drainResult{}, fmt.Errorf("naive: %d records after %s", got, time.Since(start))
		}
		msg, ok := c.Poll(100).(*kafka.Message)
		if !ok {
			continue
		}
		if first.IsZero() {
			first = time.Now()
		}
		var ev ratchetv1.Event
		if err := proto.Unmarshal(msg.Value, &ev); err != nil || ev.GetTime() == nil {
			continue
		}
		bucket := ev.GetTime().AsTime().UTC().Truncate(time.Minute)
		if _, err := conn.Exec(ctx, naiveUpsert, ev.GetMetric(), bucket, ev.GetValue()); err != nil {
			return drainResult{}, fmt.Errorf("naive upsert: %w", err)
		}
		got++
	}
	end := time.Now()
	return drainResult{Events: got, Wall: end.Sub(start), Steady: end.Sub(first)}, nil
}
