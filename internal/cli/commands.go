package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/devbroker"
	"ratchet/internal/event"
	"ratchet/internal/gcpolicy"
	"ratchet/internal/kafkaclient"
	"ratchet/internal/produce"
	"ratchet/internal/schemareg"
	"ratchet/internal/store"
)

func runCmd(ctx context.Context, e *env, args []string) error {
	fs := flags(e, "run")
	path := fs.String("config", "", "YAML configuration file (environment variables RATCHET_* win)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	if err := engine.Check(cfg, engine.Options{Processor: e.opts.Processor, Getenv: e.getenv}); err != nil {
		return err
	}
	log := newLogger(e.stderr, cfg, false)
	setCollector(e, cfg, log)
	log.Info("ratchet starting", "version", version(), "config", cfg)
	if e.opts.exit != nil {
		done := make(chan struct{})
		defer close(done)
		go stopBackstop(ctx, cfg.Shutdown.Timeout, done, e.stderr, e.opts.exit) // ends with done, or ends the process
	}
	return engine.Run(ctx, cfg, engine.Options{Logger: log, Processor: e.opts.Processor, Getenv: e.getenv})
}

func devCmd(ctx context.Context, e *env, args []string) error {
	fs := flags(e, "dev")
	path := fs.String("config", "", "YAML configuration file (environment variables RATCHET_* win)")
	addr := fs.String("broker-addr", "127.0.0.1:0", "address of the embedded broker (port 0: any free port)")
	partitions := fs.Int("partitions", 12, "partitions of the input topic")
	rate := fs.Float64("rate", 400, "demo events per second")
	poison := fs.Float64("poison", 0.01, "fraction of demo events that are poison")
	spread := fs.Duration("spread", 20*time.Minute, "spread demo event times over this past window")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	if *partitions < 1 {
		return usagef("dev: -partitions must be at least 1")
	}
	if err := engine.Check(cfg, engine.Options{Getenv: e.getenv}); err != nil {
		return err
	}
	log := newLogger(e.stderr, cfg, true)
	topics := make([]string, 0, 2*len(cfg.Kafka.Topics))
	for _, t := range cfg.Kafka.Topics {
		topics = append(topics, t, cfg.Kafka.DLQTopic(t))
	}
	b, err := devbroker.Start(devbroker.Options{Addr: *addr, Topics: topics, Partitions: int32(*partitions), Logger: log})
	if err != nil {
		return err
	}
	defer b.Close()
	cfg.Kafka.Brokers = []string{b.Addr()}
	log.Info("embedded broker listening", "addr", b.Addr(), "topics", topics, "partitions", *partitions)

	// The demo producer's spans start the traces the engine continues:
	// producer → batch → transaction.
	tracer, stopTracer, err := startTracer(e, cfg, log.With("component", "producer"))
	if err != nil {
		return err
	}
	defer stopTracer()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	produced := make(chan error, 1)
	go func() { // ends when ctx is done
		_, err := produce.Run(ctx, produce.Options{
			Brokers: cfg.Kafka.Brokers, Topic: cfg.Kafka.Topics[0], Rate: *rate, PoisonFraction: *poison,
			Format: cfg.FormatFor(cfg.Kafka.Topics[0]), TimeSpread: *spread, Seed: time.Now().UnixNano(),
			Tracer: tracer,
		}, log.With("component", "producer"))
		produced <- err
	}()
	err = engine.Run(ctx, cfg, engine.Options{Logger: log, Getenv: e.getenv, OnListening: func(addr string) {
		fmt.Fprintf(e.stdout, "\n  ratchet dev is running: open http://%s/ (Ctrl-C stops)\n\n", addr)
	}})
	cancel()
	if perr := <-produced; perr != nil && !errors.Is(perr, context.Canceled) {
		log.Warn("demo producer", "err", perr)
	}
	return err
}

func brokerCmd(ctx context.Context, e *env, args []string) error {
	fs := flags(e, "broker")
	addr := fs.String("addr", "127.0.0.1:9092", "listen address (loopback only)")
	topics := fs.String("topics", "events,events.dlq", "comma-separated topics to create")
	partitions := fs.Int("partitions", 12, "partitions per topic")
	dataDir := fs.String("data-dir", "", "persist topics, offsets and groups here across restarts")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *partitions < 1 {
		return usagef("broker: -partitions must be at least 1")
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	b, err := devbroker.Start(devbroker.Options{Addr: *addr, Topics: splitList(*topics),
		Partitions: int32(*partitions), DataDir: *dataDir, Logger: log})
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Fprintf(e.stdout, "broker listening on %s\n", b.Addr())
	log.Info("broker listening", "addr", b.Addr(), "topics", *topics, "partitions", *partitions, "data_dir", *dataDir)
	<-ctx.Done()
	log.Info("broker stopping")
	return nil
}

func produceCmd(ctx context.Context, e *env, args []string) error {
	fs := flags(e, "produce")
	path := fs.String("config", "", "YAML configuration file (for kafka.brokers, kafka.topics, kafka.format)")
	brokers := fs.String("brokers", "", "bootstrap servers (default: kafka.brokers)")
	topic := fs.String("topic", "", "topic (default: the first of kafka.topics)")
	rate := fs.Float64("rate", 1000, "events per second (0: as fast as possible)")
	count := fs.Int64("count", 0, "events to produce (0: until stopped)")
	poison := fs.Float64("poison", 0, "fraction of poison records, 0..1")
	format := fs.String("format", "", "protobuf or json (default: the topic's format)")
	seed := fs.Int64("seed", 0, "generator seed (0: time based)")
	spread := fs.Duration("spread", 0, "spread event times uniformly over this past window")
	registry := fs.String("schema-registry", "", "register the event schema in this Confluent Schema Registry and write framed records (default: schema_registry.url)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	if *registry != "" {
		cfg.SchemaRegistry.URL = config.SecretURL(*registry)
		if err := cfg.Validate(); err != nil {
			var ce *config.Error
			if errors.As(err, &ce) {
				for _, p := range ce.Problems {
					if p.Key == "schema_registry.url" {
						return usagef("produce: -schema-registry %q is not allowed (allowed: %s)", p.Value, p.Allowed)
					}
				}
			}
			return err
		}
	}
	o := produce.Options{Brokers: cfg.Kafka.Brokers, Topic: cfg.Kafka.Topics[0], Rate: *rate, Count: *count,
		PoisonFraction: *poison, Seed: *seed, TimeSpread: *spread, Properties: cfg.Kafka.Properties}
	if *brokers != "" {
		o.Brokers = splitList(*brokers)
	}
	if *topic != "" {
		o.Topic = *topic
	}
	o.Format = cfg.FormatFor(o.Topic)
	if *format != "" {
		o.Format = *format
	}
	switch {
	case o.Format != event.FormatProtobuf && o.Format != event.FormatJSON:
		return usagef("produce: -format %q is not allowed (allowed: %s, %s)", o.Format, event.FormatProtobuf, event.FormatJSON)
	case *poison < 0 || *poison > 1:
		return usagef("produce: -poison %v is not allowed (allowed: 0..1)", *poison)
	case *rate < 0:
		return usagef("produce: -rate %v is not allowed (allowed: >= 0)", *rate)
	case *count < 0:
		return usagef("produce: -count %d is not allowed (allowed: >= 0)", *count)
	}
	if o.Seed == 0 {
		o.Seed = time.Now().UnixNano()
	}
	log := newLogger(e.stderr, cfg, false)
	tracer, stopTracer, err := startTracer(e, cfg, log)
	if err != nil {
		return err
	}
	defer stopTracer()
	o.Tracer = tracer
	if cfg.SchemaRegistry.URL != "" {
		frame, id, err := schemareg.RegisterEvent(cfg.SchemaRegistry, o.Topic, o.Format)
		if err != nil {
			return err
		}
		o.Frame = frame
		log.Info("event schema registered", "registry", cfg.SchemaRegistry.URL, "subject", o.Topic+"-value", "schema_id", id)
	}
	st, err := produce.Run(ctx, o, log)
	fmt.Fprintf(e.stdout, "produced %d events (%d poison, %d failed) to %s\n", st.Produced, st.Poison, st.Failed, o.Topic)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func migrateCmd(ctx context.Context, e *env, args []string) error {
	fs := flags(e, "migrate")
	path := fs.String("config", "", "YAML configuration file (for postgres.url)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "schema up to date")
	return nil
}

func versionCmd(_ context.Context, e *env, args []string) error {
	fs := flags(e, "version")
	if err := parse(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "ratchet %s (librdkafka %s)\n", version(), kafkaVersion())
	return nil
}

func kafkaVersion() string {
	_, s := kafka.LibraryVersion()
	return s
}

func offsetsCmd(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && args[0] == "reset" {
		return offsetsResetCmd(ctx, e, args[1:])
	}
	fs := flags(e, "offsets")
	path := fs.String("config", "", "YAML configuration file")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ratchet offsets [--config FILE]")
		fmt.Fprintln(fs.Output(), "       ratchet offsets reset ... (see ratchet offsets reset -h)")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(e, *path)
	if err != nil {
		return err
	}
	rows, err := collectOffsets(ctx, cfg)
	if err != nil {
		return err
	}
	writeOffsets(e.stdout, cfg, rows)
	return nil
}

// offsetRow is one line of `ratchet offsets`.
type offsetRow struct {
	Topic     string
	Partition int32
	Stored    int64 // -1: none
	Epoch     int64
	Owner     string
	Committed int64 // -1: none
	End       int64
}

// collectOffsets reads the stored offsets from PostgreSQL and the committed
// offsets and high watermarks from Kafka. It never joins the group: a
// consumer with the group's id can read its commits without subscribing.
func collectOffsets(ctx context.Context, cfg config.Config) ([]offsetRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	stored, err := store.Offsets(ctx, pool, cfg.Kafka.GroupID)
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") { // 42P01: not migrated yet
		return nil, err
	}
	m := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Brokers: cfg.Kafka.Brokers, GroupID: cfg.Kafka.GroupID,
		Properties: cfg.Kafka.Properties})
	_ = m.SetKey("go.logs.channel.enable", false)
	_ = m.SetKey("log_level", 3)
	c, err := kafka.NewConsumer(m)
	if err != nil {
		return nil, fmt.Errorf("new kafka consumer: %w", err)
	}
	defer c.Close()
	const timeoutMs = 10000
	var rows []offsetRow
	for _, topic := range cfg.Kafka.Topics {
		md, err := c.GetMetadata(&topic, false, timeoutMs)
		if err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", topic, err)
		}
		t, ok := md.Topics[topic]
		if !ok || t.Error.Code() != kafka.ErrNoError {
			return nil, fmt.Errorf("topic %s: %v", topic, t.Error)
		}
		parts := make([]kafka.TopicPartition, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			parts = append(parts, kafka.TopicPartition{Topic: &topic, Partition: p.ID})
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i].Partition < parts[j].Partition })
		committed, err := c.Committed(parts, timeoutMs)
		var ke kafka.Error
		if errors.As(err, &ke) && ke.Code() == kafka.ErrGroupIDNotFound {
			// A group that never committed: kfake says so, Kafka answers -1.
			committed, err = nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("committed offsets of %s: %w", topic, err)
		}
		for i, p := range parts {
			_, high, err := c.QueryWatermarkOffsets(topic, p.Partition, timeoutMs)
			if err != nil {
				return nil, fmt.Errorf("watermarks of %s[%d]: %w", topic, p.Partition, err)
			}
			r := offsetRow{Topic: topic, Partition: p.Partition, Stored: -1, Committed: -1, End: high}
			if i < len(committed) && committed[i].Offset >= 0 {
				r.Committed = int64(committed[i].Offset)
			}
			for _, s := range stored {
				if s.Topic == topic && s.Partition == p.Partition {
					r.Stored, r.Epoch, r.Owner = s.Next, s.Epoch, s.Owner
				}
			}
			rows = append(rows, r)
		}
	}
	return rows, nil
}

func writeOffsets(w interface{ Write([]byte) (int, error) }, cfg config.Config, rows []offsetRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "topic\tpartition\tstored\tepoch\towner\tkafka committed\tend\tlag\twould-be rewind\t\n")
	dash := func(v int64) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprint(v)
	}
	for _, r := range rows {
		pos := r.Stored
		if pos < 0 {
			pos = r.Committed
		}
		lag := int64(-1)
		if pos >= 0 {
			lag = max(r.End-pos, 0)
		} else {
			lag = r.End
		}
		rewind := "-"
		if r.Stored >= 0 && r.Committed >= 0 {
			rewind = fmt.Sprint(r.Stored - r.Committed)
		}
		owner := r.Owner
		if owner == "" {
			owner = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t\n", r.Topic, r.Partition, dash(r.Stored),
			dash(r.Epoch), owner, dash(r.Committed), r.End, lag, rewind)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\ngroup %s, mode %s. would-be rewind: records Kafka's committed offset alone would replay on the next assignment.\n",
		cfg.Kafka.GroupID, cfg.Commit.Mode)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// setCollector sets the soft memory limit and the collector's growth ratio
// that processing.memory_budget calls for, leaving GOMEMLIMIT and GOGC to
// the operator when they are set (package gcpolicy; deploy/README.md,
// Sizing).
func setCollector(e *env, cfg config.Config, log *slog.Logger) {
	s := gcpolicy.Apply(e.environ, int64(cfg.Processing.MemoryBudget))
	if s.Limit != 0 {
		log.Debug("soft memory limit set", "bytes", s.Limit, "override", "GOMEMLIMIT")
	}
	if s.Percent != 0 {
		log.Debug("collector growth ratio set", "gogc", s.Percent, "override", "GOGC")
	}
}
