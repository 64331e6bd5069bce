// Command label-counter is a runnable custom processor: it counts events per
// (metric, region label) in its own table, with ratchet's guarantees (in
// exactly-once mode the counts and the offsets commit in one transaction).
// It also reads the Kafka record around each event: an event without a
// region label takes the record's "region" header, and each row keeps the
// latest Kafka timestamp it counted.
//
//	go run ./examples/label-counter            # uses RATCHET_* variables
//	RATCHET_KAFKA_BROKERS=127.0.0.1:9092 go run ./examples/label-counter
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/processor"
)

// labelCounter upserts one row per (metric, region) seen in a batch.
type labelCounter struct{}

func (labelCounter) Name() string { return "label-counter" }

func (labelCounter) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	type key struct{ metric, region string }
	counts := map[key]int64{}
	latest := map[key]time.Time{}
	for i := range b.Records {
		r := &b.Records[i]
		region := r.Event.Labels["region"]
		if region == "" {
			// Headers share memory with the consumed record: converting
			// to a string copies only what is kept.
			if h, ok := r.Header("region"); ok {
				region = string(h)
			}
		}
		k := key{r.Event.Metric, region}
		counts[k]++
		// Timestamp is the producer's clock (CreateTime) or the broker's
		// (LogAppendTime), as the topic is configured; none is the zero time.
		if r.TimestampType != processor.TimestampNone && r.Timestamp.After(latest[k]) {
			latest[k] = r.Timestamp
		}
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	// A stable order keeps concurrent partitions from deadlocking.
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].metric < keys[j].metric || keys[i].metric == keys[j].metric && keys[i].region < keys[j].region
	})
	for _, k := range keys {
		var seen *time.Time
		if t, ok := latest[k]; ok {
			seen = &t
		}
		if _, err := tx.Exec(ctx, `INSERT INTO label_counts (metric, region, count, last_record_at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (metric, region) DO UPDATE SET count = label_counts.count + EXCLUDED.count,
				last_record_at = GREATEST(label_counts.last_record_at, EXCLUDED.last_record_at)`,
			k.metric, k.region, counts[k], seen); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	cfg, err := config.Load("", os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The processor's own schema is created once, before any batch.
	conn, err := pgx.Connect(ctx, cfg.Postgres.URL.Reveal())
	if err != nil {
		log.Error("connect", "url", cfg.Postgres.URL, "err", config.RedactURL(err.Error()))
		os.Exit(1)
	}
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS label_counts (
		metric text, region text, count bigint NOT NULL, last_record_at timestamptz,
		PRIMARY KEY (metric, region))`)
	conn.Close(ctx)
	if err != nil {
		log.Error("create label_counts", "err", err)
		os.Exit(1)
	}
	if err := engine.Run(ctx, cfg, engine.Options{Processor: labelCounter{}, Logger: log}); err != nil {
		log.Error("engine stopped", "err", err)
		os.Exit(1)
	}
}
