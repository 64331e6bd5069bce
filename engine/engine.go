// Package engine runs ratchet: it connects to PostgreSQL, migrates the
// schema, starts the actor system (supervisor, partition actors, committer,
// dead-letter queue) and the HTTP endpoints, and blocks until its context
// ends, then stops in the order DESIGN.md gives: stop polling, finish
// batches, flush commits, close the consumer, flush the dead-letter
// producer, close the pool.
//
// Library users run it with their own processor.Processor:
//
//	err := engine.Run(ctx, cfg, engine.Options{Processor: myProcessor})
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/metrics"
	"ratchet/internal/store"
	"ratchet/internal/tracing"
	"ratchet/internal/tracing/otlp"
	"ratchet/internal/web"
	"ratchet/processor"
	"ratchet/processor/dashboard"
	"ratchet/processor/pipeline"
)

// Options are the parts of a run that are not configuration.
type Options struct {
	// Processor applies the batches; nil means the built-in dashboard.
	Processor processor.Processor
	// Logger receives every log line; nil means slog.Default().
	Logger *slog.Logger
	// Registry receives the metrics; nil means a new registry.
	Registry *prometheus.Registry
	// OnListening is called with the HTTP address once it listens.
	OnListening func(addr string)
	// Owner names this instance in the offset store; empty means
	// kafka.instance_id, else hostname:pid.
	Owner string
	// Decoder, when set, decodes every record value in place of
	// kafka.format and schema registry framing (for processors of your own
	// message types): it gets the raw value and sets Record.Decoded. A value
	// it refuses goes to the dead-letter topic with its error as the reason.
	Decoder processor.Decoder
	// Clock times the dead-letter log's summaries; nil means the real
	// time (tests move one by hand).
	Clock actors.Clock
	// TracerProvider, when set, receives the spans in place of the OTLP
	// exporter that tracing.enabled sets up from the OTEL_* variables
	// (tests hand in an SDK provider with an in-memory recorder). Spans
	// are made only with tracing.enabled.
	TracerProvider trace.TracerProvider
	// Getenv reads the OTEL_* variables ratchet interprets itself (the
	// protocol, the sampler); nil means os.Getenv. The OTLP exporter reads
	// its own (endpoint, headers, TLS) from the process environment.
	Getenv func(string) string
	// RejectWait bounds how long a batch waits, before it commits, for the
	// dead letters of the records a processor took out of it
	// (processor.Rejecter); past it the batch is applied again with those
	// records isolated by splitting it. Zero: actors.DefaultRejectWait.
	// Negative: no record is taken out, every refusal splits its batch
	// (the tests and the bench compare both ways).
	RejectWait time.Duration
}

func (o Options) getenv() func(string) string {
	if o.Getenv != nil {
		return o.Getenv
	}
	return os.Getenv
}

// Run runs the engine until ctx is done and returns nil after a clean stop.
func Run(ctx context.Context, cfg config.Config, opts Options) error {
	e, err := newEngine(cfg, opts)
	if err != nil {
		return err
	}
	err = e.run(ctx)
	e.stopTracing()
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped while starting (waiting for PostgreSQL or Kafka,
		// migrations, topic checks): a clean stop, nothing was consumed yet.
		e.log.Info("engine stopped while starting", "reason", err.Error())
		return nil
	}
	return err
}

type engine struct {
	cfg  config.Config
	opts Options
	log  *slog.Logger
	reg  *prometheus.Registry
	// backfills exports the pipelines' backfill progress (nil without
	// pipelines).
	backfills *backfillCollector
	m         *metrics.Metrics
	// decoders returns a new partition's value decoder (see newDecoders).
	decoders func(topic string) actors.ValueDecoder
	// tracer makes the spans, nil with tracing off; sdk is the provider
	// the engine set up for it (nil when none or handed in), which
	// stopTracing flushes by stopBy, the stop's deadline.
	tracer *tracing.Tracer
	sdk    *sdktrace.TracerProvider
	stopBy func() time.Time
	// pipelines are the configured pipelines, nil without; run binds them
	// to the database and makes them the processor.
	pipelines *pipeline.Set
}

func newEngine(cfg config.Config, opts Options) (*engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pipelines, err := compilePipelines(cfg, opts)
	if err != nil {
		return nil, err
	}
	if opts.Processor == nil && pipelines == nil {
		opts.Processor = dashboard.New()
	}
	if pipelines == nil {
		if err := checkFormats(cfg, opts); err != nil {
			return nil, err
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	warnRollupReplays(cfg, opts.Logger)
	if opts.Owner == "" {
		opts.Owner = cfg.Kafka.InstanceID
	}
	if opts.Owner == "" {
		host, _ := os.Hostname()
		opts.Owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	reg := opts.Registry
	var m *metrics.Metrics
	if reg == nil {
		reg, m = metrics.NewRegistry()
	} else {
		m = metrics.New(reg)
	}
	decoders, err := newDecoders(cfg, opts, pipelines, m)
	if err != nil {
		return nil, err
	}
	e := &engine{cfg: cfg, opts: opts, log: opts.Logger, reg: reg, m: m, decoders: decoders, pipelines: pipelines,
		stopBy: func() time.Time { return time.Now().Add(cfg.Shutdown.Timeout) }}
	if pipelines != nil {
		e.backfills = newBackfillCollector(cfg.Kafka.GroupID)
		reg.MustRegister(e.backfills)
	}
	if err := e.startTracing(); err != nil {
		return nil, err
	}
	return e, nil
}

// startTracing sets up tracing when tracing.enabled: the provider handed
// in, or an OTLP exporter configured by the OTEL_* variables, whose bad
// values are configuration errors (exit code 2) found before anything is
// connected.
func (e *engine) startTracing() error {
	if !e.cfg.Tracing.Enabled {
		return nil
	}
	tp := e.opts.TracerProvider
	if tp == nil {
		s, err := otlp.Read(e.opts.getenv())
		if err != nil {
			return err
		}
		sdk, err := otlp.New(context.Background(), s)
		if err != nil {
			return err
		}
		e.sdk, tp = sdk, sdk
		otlp.LogErrors(e.log)
		e.log.Info("tracing on", "protocol", s.Protocol, "sampler", s.SamplerName, "ratio", s.Ratio)
	}
	e.tracer = tracing.New(tp, tracing.Options{Group: e.cfg.Kafka.GroupID})
	return nil
}

// stopTracing flushes the spans still queued and stops the exporter the
// engine set up, by the stop's deadline.
func (e *engine) stopTracing() {
	if e.sdk == nil {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), e.stopBy())
	defer cancel()
	if err := e.sdk.Shutdown(ctx); err != nil {
		e.log.Warn("trace export did not finish by the stop's deadline", "err", err)
	}
}

func (e *engine) run(ctx context.Context) error {
	cfg := e.cfg
	// The HTTP server listens before anything is connected: while the
	// start waits for PostgreSQL and Kafka, /healthz answers 200 (the
	// process is alive; a liveness probe must not kill a pod that waits
	// for its database) and /readyz 503 with what it waits for.
	starting := web.NewStarting(web.Pipeline{Instance: e.opts.Owner, Group: cfg.Kafka.GroupID, Mode: cfg.Commit.Mode},
		"connecting to PostgreSQL")
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer func() { stopHTTP(); wg.Wait() }() // a start that fails stops the server too
	if cfg.HTTP.Addr != "" {
		srv := web.New(web.Options{Addr: cfg.HTTP.Addr, Gatherer: e.reg, Logger: e.log, Source: starting,
			IncludeValues: cfg.Log.IncludeValues})
		listening := make(chan error, 1)
		wg.Go(func() { // ends when httpCtx is cancelled, after the supervisor stopped
			err := srv.Run(httpCtx, func(addr string) {
				listening <- nil
				if e.opts.OnListening != nil {
					e.opts.OnListening(addr)
				}
			})
			listening <- err
			if err != nil {
				errs <- err
			}
		})
		// A port in use stops the start before anything is connected.
		if err := <-listening; err != nil {
			return err
		}
	}

	// Every step that needs PostgreSQL or Kafka is retried until
	// startup.timeout, counted from here, runs out.
	start := newStarter(e.log, cfg.Startup.Timeout, starting.Wait)
	var pool *pgxpool.Pool
	err := start.do(ctx, "PostgreSQL", func(ctx context.Context) error {
		p, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), int32(cfg.Postgres.MaxConns))
		if err != nil {
			return startPostgresError(err)
		}
		if err := store.Migrate(ctx, p); err != nil {
			p.Close()
			return startPostgresError(err)
		}
		if e.pipelines != nil {
			// The pipelines' tables are the user's: a table that does not
			// fit stops the start (exit code 2); a failed query is retried.
			proc, err := bindPipelines(ctx, p, e.pipelines, e.m)
			if err != nil {
				p.Close()
				if config.IsConfigError(err) {
					return permanent(err)
				}
				return startPostgresError(err)
			}
			// A pipeline whose definition changed under its name stops
			// the start (exit code 2); a failed query is retried, never
			// read as "nothing recorded".
			adopted, err := recordDefinitions(ctx, p, cfg)
			if err != nil {
				p.Close()
				if config.IsConfigError(err) {
					return permanent(err)
				}
				return startPostgresError(err)
			}
			if adopted > 0 {
				e.log.Info("pipelines adopted: their origins are recorded at the stored positions, and what lies before may already be applied",
					"origins", adopted, "group", cfg.Kafka.GroupID)
			}
			proc.RecordOrigins(cfg.Kafka.GroupID)
			e.opts.Processor = proc
		}
		pool = p
		return nil
	})
	if err != nil {
		return err
	}
	// The pool in use at return (see the resize below). Close waits for
	// every connection to come back; one still held by a batch that
	// ignores its context must not hold the exit past the stop's deadline
	// (closeBy, set below once the deadline is known).
	closeBy := func() time.Time { return time.Now().Add(cfg.Shutdown.Timeout) }
	defer func() { awaitDone(pool.Close, closeBy()) }()
	exactlyOnce := cfg.Commit.Mode == config.ModeExactlyOnce
	e.log.Info("engine starting", "owner", e.opts.Owner, "group", cfg.Kafka.GroupID,
		"topics", cfg.Kafka.Topics, "mode", cfg.Commit.Mode, "processor", e.opts.Processor.Name(),
		"schema_registry", cfg.SchemaRegistry.URL)

	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(minLevel{h: e.log.Handler(), min: slog.LevelWarn}).With("lib", "protoactor")
	}))

	// Last in the stop sequence (shared/DESIGN.md): it only closes the
	// system's internal channel (the actors are stopped above it), and it
	// must run once.
	defer system.Shutdown()

	// The stop's deadline: shutdown.timeout counted from the stop (or a
	// whole one when the engine stops for an error). The DLQ flushes last
	// with what is left of it, and nothing after the supervisor waits past
	// it.
	var stopAt atomic.Int64 // unix nanoseconds; 0 until ctx is done
	defer context.AfterFunc(ctx, func() { stopAt.Store(time.Now().UnixNano()) })()
	flushBy := func() time.Time {
		if at := stopAt.Load(); at != 0 {
			return time.Unix(0, at).Add(cfg.Shutdown.Timeout)
		}
		return time.Now().Add(cfg.Shutdown.Timeout)
	}
	closeBy = flushBy
	e.stopBy = flushBy
	commits := actors.NewCommitGate()
	committer, err := system.Root.SpawnNamed(actor.PropsFromProducer(actors.NewCommitter(actors.CommitterConfig{
		Kafka:    func() actors.OffsetCommitter { return commits },
		Interval: cfg.Commit.Interval,
		Metrics:  e.m,
		Logger:   e.log,
		Tracer:   e.tracer,
	})), "committer")
	if err != nil {
		return fmt.Errorf("spawn committer: %w", err)
	}
	defer func() { awaitStopped(system.Root.PoisonFuture(committer), flushBy()) }()

	// A partition waits for its dead letters' delivery reports before its
	// batch commits, so the DLQ producer sends at once instead of lingering
	// to fill batches (unless kafka.properties says otherwise).
	dlqProps := map[string]string{"linger.ms": "0"}
	for k, v := range cfg.Kafka.Properties {
		dlqProps[k] = v
	}
	producer, err := kafkaclient.NewProducer(cfg.Kafka.Brokers, dlqProps, e.log)
	if err != nil {
		return err
	}
	var inputPartitions int
	starting.Wait("reading the input topics from Kafka")
	suspectLogins := 0 // attempts in a row that ended on a failed login
	err = start.do(ctx, "Kafka", func(ctx context.Context) error {
		n, err := ensureDLQTopics(ctx, producer, cfg, e.log)
		inputPartitions = n
		if err == nil {
			return nil
		}
		refused, suspect := refusedByBrokers(producer)
		if refused != nil {
			return permanent(fmt.Errorf("%w (%v)", err, refused))
		}
		if suspect == nil {
			suspectLogins = 0
		} else if suspectLogins++; suspectLogins >= 2 {
			return permanent(fmt.Errorf("%w (at every attempt: %v)", err, suspect))
		}
		return startKafkaError(err)
	})
	if err != nil {
		producer.Close()
		return err
	}
	if cfg.Postgres.MaxConns == 0 {
		// postgres.max_conns 0 means "input partitions + 4, at most
		// DefaultMaxConns". The first pool (pgx's default size) only pinged
		// and migrated.
		err := start.do(ctx, "PostgreSQL", func(ctx context.Context) error {
			sized, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), int32(DefaultPoolSize(inputPartitions)))
			if err != nil {
				return startPostgresError(err)
			}
			pool.Close()
			pool = sized
			return nil
		})
		if err != nil {
			producer.Close()
			return err
		}
	}
	if e.backfills != nil {
		e.backfills.set(pool)
		defer e.backfills.set(nil) // before the pool closes
	}
	// The dead-letter log's last summaries are written once the
	// supervisor stopped its partitions (below, before "engine stopped"),
	// or, when the start ends early, by this defer: every dead letter
	// counted is in the log. A letter of a partition that outlives the
	// stop is logged in full (Close).
	guard := newGuard(cfg, e.m, e.log)
	deadLetterLog := actors.NewDeadLetterLog(actors.DeadLetterLogConfig{Mode: cfg.Log.DeadLetters, IncludeValues: cfg.Log.IncludeValues,
		Interval: cfg.Log.DeadLetterInterval, Logger: e.log, Clock: e.opts.Clock})
	defer deadLetterLog.Close()
	wg.Go(func() { deadLetterLog.Run(httpCtx) }) // ends with the HTTP server, after the supervisor stopped
	dlq, err := system.Root.SpawnNamed(actor.PropsFromProducer(actors.NewDLQ(actors.DLQConfig{
		Producer: producer, Topic: cfg.Kafka.DLQTopic, Logger: e.log, FlushBy: flushBy,
		Backoff: actors.RetryPolicy{InitialBackoff: cfg.Retry.InitialBackoff, MaxBackoff: cfg.Retry.MaxBackoff},
	})), "dlq")
	if err != nil {
		producer.Close()
		return fmt.Errorf("spawn dlq: %w", err)
	}
	// Stopped after the supervisor: partitions may wait on it until drained.
	defer func() { awaitStopped(system.Root.PoisonFuture(dlq), flushBy()) }()

	var claim actors.ClaimFunc
	var resetWatch *actors.ResetWatch
	if exactlyOnce {
		resetWatch = actors.NewResetWatch(actors.ResetWatchConfig{
			Root: system.Root, Logger: e.log,
			Read: func(ctx context.Context) ([]store.OwnedPosition, error) {
				return store.OwnedPositions(ctx, pool, cfg.Kafka.GroupID, e.opts.Owner)
			},
		})
		wg.Go(func() { resetWatch.Run(httpCtx) }) // ends with the HTTP server, after the supervisor stopped
	}
	if exactlyOnce {
		claim = func(ctx context.Context, reqs []store.ClaimRequest) ([]store.Claim, []error) {
			return store.ClaimPartitions(ctx, pool, cfg.Kafka.GroupID, e.opts.Owner, reqs)
		}
	}
	sup := actors.NewSupervisor(system, actors.SupervisorConfig{
		NewConsumer: func() (*kafka.Consumer, error) {
			return kafkaclient.NewConsumer(kafkaclient.ConsumerOptions{
				Brokers:         cfg.Kafka.Brokers,
				GroupID:         cfg.Kafka.GroupID,
				InstanceID:      cfg.Kafka.InstanceID,
				AutoOffsetReset: cfg.Kafka.AutoOffsetReset,
				Properties:      cfg.Kafka.Properties,
				Partitions:      inputPartitions,
			}, e.log)
		},
		Commits: commits,
		Topics:  cfg.Kafka.Topics,
		Claim:   claim,
		Reposition: func(ctx context.Context, c store.Claim, next int64) (store.Claim, error) {
			return store.MoveOffset(ctx, pool, c, next)
		},
		Format:          cfg.FormatFor,
		NewDecoder:      e.decoders,
		AutoOffsetReset: cfg.Kafka.AutoOffsetReset,
		BatchSize:       cfg.Processing.BatchSize,
		MaxBatch:        cfg.Processing.MaxBatch(),
		Linger:          cfg.Processing.BatchLinger,
		MaxBuffered:     cfg.Processing.MaxBufferedPerPartition,
		MemoryBudget:    int64(cfg.Processing.MemoryBudget),
		Retry: actors.RetryPolicy{
			InitialBackoff: cfg.Retry.InitialBackoff,
			MaxBackoff:     cfg.Retry.MaxBackoff,
			MaxAttempts:    cfg.Retry.MaxAttempts,
		},
		Applier:          store.New(pool, e.opts.Processor, storeOptions(cfg)...),
		DLQ:              actors.DLQClient{Root: system.Root, PID: dlq},
		DLQTopic:         cfg.Kafka.DLQTopic,
		Committer:        committer,
		DrainTimeout:     cfg.Shutdown.Timeout,
		InstanceID:       cfg.Kafka.InstanceID,
		GroupID:          cfg.Kafka.GroupID,
		RecycleInterval:  cfg.Kafka.RecycleInterval,
		BrokersDownAfter: 2 * time.Minute,
		MaxRestarts:      cfg.Supervision.MaxRestarts,
		RestartWindow:    cfg.Supervision.Within,
		Metrics:          e.m,
		Logger:           e.log,
		ResetWatch:       resetWatch,
		DeadLetterLog:    deadLetterLog,
		Tracer:           e.tracer,
		Guard:            guard,
		RejectWait:       e.opts.RejectWait,

		// The assignment watchdog's bound: see actors.AssignmentTimeout.
		SessionTimeout:    sessionTimeout(cfg),
		AssignmentTimeout: actors.AssignmentTimeout(sessionTimeout(cfg), cfg.Shutdown.Timeout),
	})

	// From here the page and the probes read the running engine.
	var src web.Source = &source{cfg: cfg, owner: e.opts.Owner, board: sup.Board(), pool: pool, guard: guard}
	if e.pipelines != nil {
		src = &pipelineSource{source: src.(*source), m: e.m}
	}
	starting.Serve(src)
	wg.Go(func() {
		// The page stays up through the drain (readiness says draining),
		// then goes.
		defer stopHTTP()
		errs <- sup.Run(ctx)
	})
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		if err != nil {
			all = append(all, err)
		}
	}
	deadLetterLog.Close()
	e.log.Info("engine stopped")
	return errors.Join(all...)
}

// awaitStopped waits for an actor's stop (f, from PoisonFuture) until by,
// and no longer: an actor still busy then (the committer inside a commit
// that the stop already gave up on, waiting out socket.timeout.ms) must not
// hold the process past shutdown.timeout. The process exits right after.
func awaitStopped(f *actor.Future, by time.Time) {
	awaitDone(func() { _ = f.Wait() }, by) // the future completes in 10 s at most
}

// awaitDone runs fn on a goroutine of its own and waits for it until by;
// fn is abandoned then (the process exits right after).
func awaitDone(fn func(), by time.Time) {
	done := make(chan struct{})
	go func() { fn(); close(done) }() // ends when fn returns
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// minLevel drops records below min; it keeps protoactor's chatty Info lines
// out of our logs.
type minLevel struct {
	h   slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.h.Enabled(ctx, l)
}
func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h: m.h.WithAttrs(a), min: m.min}
}
func (m minLevel) WithGroup(n string) slog.Handler { return minLevel{h: m.h.WithGroup(n), min: m.min} }

// ensureDLQTopics creates the dead-letter topic of every input topic that
// lacks one, with the input's partition count, or says clearly why it
// cannot. It returns the number of partitions of the input topics (a
// missing topic counts as one).
func ensureDLQTopics(ctx context.Context, p *kafka.Producer, cfg config.Config, log *slog.Logger) (int, error) {
	admin, err := kafka.NewAdminClientFromProducer(p)
	if err != nil {
		return 0, fmt.Errorf("admin client: %w", err)
	}
	defer admin.Close()
	// GetMetadata takes no context: its timeout is what is left of ctx's
	// deadline (one start-up attempt), at most 10 s.
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	md, err := admin.GetMetadata(nil, true, int(timeout.Milliseconds()))
	if err != nil {
		return 0, fmt.Errorf("read topics from %v: %w", cfg.Kafka.Brokers, err)
	}
	var specs []kafka.TopicSpecification
	total := 0
	for _, t := range cfg.Kafka.Topics {
		in, ok := md.Topics[t]
		parts := 1
		if ok && in.Error.Code() == kafka.ErrNoError {
			parts = max(len(in.Partitions), 1)
			log.Info("input topic", "topic", t, "partitions", len(in.Partitions))
		} else {
			log.Warn("input topic not found; it will be consumed once it exists", "topic", t)
		}
		total += parts
		dlq := cfg.Kafka.DLQTopic(t)
		if d, ok := md.Topics[dlq]; ok && d.Error.Code() == kafka.ErrNoError && len(d.Partitions) > 0 {
			continue
		}
		specs = append(specs, kafka.TopicSpecification{Topic: dlq, NumPartitions: parts, ReplicationFactor: -1})
	}
	if len(specs) == 0 {
		return total, nil
	}
	res, err := admin.CreateTopics(ctx, specs)
	if err != nil {
		return 0, fmt.Errorf("dead-letter topic missing and not created: %w", err)
	}
	for _, r := range res {
		switch r.Error.Code() {
		case kafka.ErrNoError:
			log.Info("dead-letter topic created", "topic", r.Topic)
		case kafka.ErrTopicAlreadyExists:
		default:
			return 0, fmt.Errorf("dead-letter topic %s is missing and could not be created (create it, or set kafka.dlq_topic): %w",
				r.Topic, r.Error)
		}
	}
	return total, nil
}

// sessionTimeout is the consumer's session.timeout.ms: the value in
// kafka.properties, else the default kafkaclient sets; 0 when it does not
// parse (librdkafka then refuses the consumer).
func sessionTimeout(cfg config.Config) time.Duration {
	m := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Properties: cfg.Kafka.Properties})
	v, err := m.Get("session.timeout.ms", nil)
	if err != nil {
		return 0
	}
	ms, err := strconv.Atoi(strings.TrimSpace(fmt.Sprint(v)))
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// storeOptions are the store's settings from cfg. AsyncCommit applies to
// exactly-once transactions only (the store sees no claim otherwise), and
// validation refuses it with at-least-once.
func storeOptions(cfg config.Config) []store.Option {
	if cfg.Postgres.SynchronousCommit == "off" {
		return []store.Option{store.AsyncCommit()}
	}
	return nil
}

// DefaultMaxConns caps the pool that postgres.max_conns 0 sizes.
const DefaultMaxConns = 16

// DefaultPoolSize is the pool size postgres.max_conns 0 means for an
// instance reading topics with partitions partitions in all: one connection
// per partition plus four for claims, commits and the page, so that every
// partition of a small assignment can have a transaction open at once (a
// slow transaction never makes another partition queue for a connection),
// but never more than DefaultMaxConns. Past that, connections add no
// throughput, only contention: every batch transaction is one round trip,
// so a few connections keep many partitions applying, while more
// transactions at once wait on each other's row locks (the dashboard's
// rollup rows) and cost the server CPU. With 1024 partitions the default
// used to open 60-70 connections and drained 10-15 % slower than with 16
// (bench/findings.md); and it could exhaust PostgreSQL's max_connections
// (100 by default) with a single instance.
func DefaultPoolSize(partitions int) int {
	return min(partitions+4, DefaultMaxConns)
}
