// Command raw-archive is a runnable custom processor for input that is not
// ratchet.v1.Event: with kafka.format raw nothing is decoded, and it keeps
// every record as it came (key, headers, value, Kafka timestamp) in its own
// table, exactly once per offset in exactly-once mode.
//
//	RATCHET_KAFKA_FORMAT=raw RATCHET_KAFKA_TOPICS=audit go run ./examples/raw-archive
//
// To decode your own message type instead, pass engine.Options.Decoder: it
// gets each raw value and sets Record.Decoded; a value it refuses goes to
// the dead-letter topic with its error as the reason. This example accepts
// every value, so it sets none.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/processor"
)

// archive copies a batch's records into raw_archive.
type archive struct{}

func (archive) Name() string { return "raw-archive" }

func (archive) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	rows := make([][]any, 0, len(b.Records))
	for _, r := range b.Records {
		// Key, Value and the header values share memory with the consumed
		// record; CopyFrom reads them without copying them first.
		headers := make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			headers[h.Key] = string(h.Value)
		}
		hj, err := json.Marshal(headers)
		if err != nil {
			return processor.Permanent(err)
		}
		var ts any
		if r.TimestampType != processor.TimestampNone {
			ts = r.Timestamp
		}
		rows = append(rows, []any{r.Topic, r.Partition, r.Offset, r.Key, r.Value, hj, ts, r.TimestampType.String()})
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"raw_archive"},
		[]string{"topic", "partition", "kafka_offset", "key", "value", "headers", "kafka_time", "time_type"},
		pgx.CopyFromRows(rows))
	return err
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
	conn, err := pgx.Connect(ctx, cfg.Postgres.URL.Reveal())
	if err != nil {
		log.Error("connect", "url", cfg.Postgres.URL, "err", config.RedactURL(err.Error()))
		os.Exit(1)
	}
	// One row per offset: in exactly-once mode a record is never copied twice.
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS raw_archive (
		topic text, partition int, kafka_offset bigint, key bytea, value bytea, headers jsonb,
		kafka_time timestamptz, time_type text, PRIMARY KEY (topic, partition, kafka_offset))`)
	conn.Close(ctx)
	if err != nil {
		log.Error("create raw_archive", "err", err)
		os.Exit(1)
	}
	if err := engine.Run(ctx, cfg, engine.Options{Processor: archive{}, Logger: log}); err != nil {
		log.Error("engine stopped", "err", err)
		os.Exit(1)
	}
}
