package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/produce"
	"ratchet/processor"
)

// rewindResult counts what restarts did to one consumer's ledger.
type rewindResult struct {
	Name     string
	Produced int64
	Applied  int64 // ledger rows
	Distinct int64 // distinct event ids in the ledger
	Cycles   int
}

// Replayed is how many applications were repeats.
func (r rewindResult) Replayed() int64 { return r.Applied - r.Distinct }

// Lost is how many produced events were never applied.
func (r rewindResult) Lost() int64 { return r.Produced - r.Distinct }

// contestant is one consumer put through the restart cycles.
type contestant struct {
	name string   // also the topic, group and ledger table suffix
	args []string // worker subcommand and its flags
}

// measureRewinds produces to the contestant's topic at rate while it is
// started, run for runFor, sent SIGTERM and restarted cycles times; then the
// producer stops, one last instance catches up, and the ledger is counted.
func measureRewinds(ctx context.Context, env *benchEnv, ct contestant, rate float64, cycles int, runFor time.Duration) (rewindResult, error) {
	table := "ledger_" + strings.ReplaceAll(ct.name, "-", "_")
	if _, err := env.db.pool.Exec(ctx, "CREATE TABLE "+table+" (id text NOT NULL)"); err != nil {
		return rewindResult{}, fmt.Errorf("ledger: %w", err)
	}
	topic := "rw-" + ct.name
	self, err := os.Executable()
	if err != nil {
		return rewindResult{}, err
	}
	args := append(append([]string{}, ct.args...), "-brokers", strings.Join(env.brokers, ","), "-topic", topic,
		"-group", "rw-"+ct.name, "-db", env.db.url, "-table", table, "-instance", "rw-"+ct.name+"-0")
	logPath := env.outPath("worker-" + ct.name + ".log")
	start := func() (*ratchetProc, error) {
		lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(self, args...)
		cmd.Env = cleanEnv()
		cmd.Stdout, cmd.Stderr = lf, lf
		if err := cmd.Start(); err != nil {
			lf.Close()
			return nil, fmt.Errorf("start worker: %w", err)
		}
		p := &ratchetProc{cmd: cmd, done: make(chan error, 1)}
		go func() { p.done <- cmd.Wait(); lf.Close() }() // ends when the worker exits
		return p, nil
	}

	pctx, stopProducer := context.WithCancel(ctx)
	defer stopProducer()
	type pres struct {
		st  produce.Stats
		err error
	}
	pdone := make(chan pres, 1)
	go func() { // ends when stopProducer is called
		st, err := produce.Run(pctx, produce.Options{Brokers: env.brokers, Topic: topic, Rate: rate, Seed: 4242}, env.engineLog)
		pdone <- pres{st, err}
	}()
	for i := 0; i < cycles; i++ {
		p, err := start()
		if err != nil {
			return rewindResult{}, err
		}
		select {
		case err := <-p.done:
			return rewindResult{}, fmt.Errorf("%s exited by itself in cycle %d: %v (see %s)", ct.name, i, err, logPath)
		case <-time.After(runFor):
		}
		err = p.stop(60 * time.Second)
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			return rewindResult{}, fmt.Errorf("%s cycle %d: %w", ct.name, i, err)
		}
	}
	stopProducer()
	pr := <-pdone
	if pr.err != nil {
		return rewindResult{}, fmt.Errorf("rewind producer: %w", pr.err)
	}
	// The last instance catches up; done when every id is in the ledger or
	// nothing changed for 5 s (lost events never come).
	p, err := start()
	if err != nil {
		return rewindResult{}, err
	}
	res := rewindResult{Name: ct.name, Produced: pr.st.Produced, Cycles: cycles}
	lastChange, lastRows := time.Now(), int64(-1)
	for {
		time.Sleep(250 * time.Millisecond)
		if err := env.db.pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM "+table).Scan(&res.Applied, &res.Distinct); err != nil {
			_ = p.stop(60 * time.Second)
			return rewindResult{}, err
		}
		if res.Applied != lastRows {
			lastRows, lastChange = res.Applied, time.Now()
		}
		if res.Distinct >= res.Produced && time.Since(lastChange) > time.Second || time.Since(lastChange) > 5*time.Second {
			break
		}
	}
	_ = p.stop(60 * time.Second)
	if err := env.db.pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM "+table).Scan(&res.Applied, &res.Distinct); err != nil {
		return rewindResult{}, err
	}
	return res, nil
}

// workerFlags are the flags every worker subcommand takes.
type workerFlags struct {
	brokers, topic, group, db, table, instance string
	commitBeforeClose                          bool
	mode                                       string
}

func parseWorker(name string, args []string) workerFlags {
	var w workerFlags
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	fs.StringVar(&w.brokers, "brokers", "", "bootstrap servers")
	fs.StringVar(&w.topic, "topic", "", "topic")
	fs.StringVar(&w.group, "group", "", "consumer group")
	fs.StringVar(&w.db, "db", "", "PostgreSQL URL")
	fs.StringVar(&w.table, "table", "", "ledger table")
	fs.StringVar(&w.instance, "instance", "", "group.instance.id")
	fs.BoolVar(&w.commitBeforeClose, "commit-before-close", false, "naive: on SIGTERM commit, then Close")
	fs.StringVar(&w.mode, "mode", config.ModeExactlyOnce, "ratchet: commit.mode")
	_ = fs.Parse(args)
	return w
}

// naiveWorker is the loop users write: Poll, one autocommit INSERT per
// record, librdkafka's auto commit. Without -commit-before-close it has no
// signal handling, so SIGTERM ends it at once (Go's default). With it,
// SIGTERM stops the loop, commits the stored offsets and closes.
func naiveWorker(args []string) error {
	w := parseWorker("naive", args)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, w.db)
	if err != nil {
		return err
	}
	c, err := kafka.NewConsumer(naiveConfig(strings.Split(w.brokers, ","), w.group, w.instance))
	if err != nil {
		return err
	}
	if err := c.SubscribeTopics([]string{w.topic}, nil); err != nil {
		return err
	}
	var stop chan os.Signal
	if w.commitBeforeClose {
		stop = make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	}
	insert := "INSERT INTO " + w.table + " (id) VALUES ($1)"
	for {
		select {
		case <-stop:
			if _, err := c.Commit(); err != nil {
				slog.Warn("commit before close", "err", err)
			}
			err := c.Close()
			conn.Close(ctx)
			return err
		default:
		}
		msg, ok := c.Poll(100).(*kafka.Message)
		if !ok {
			continue
		}
		if _, err := conn.Exec(ctx, insert, string(msg.Key)); err != nil {
			return err
		}
	}
}

// ratchetWorker runs the engine with a processor that appends every
// record's id to the ledger inside the batch transaction, until SIGTERM.
func ratchetWorker(args []string) error {
	w := parseWorker("ratchet", args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg := engineConfig(strings.Split(w.brokers, ","), w.db, w.topic, w.group, w.mode)
	cfg.Kafka.InstanceID = w.instance
	insert := "INSERT INTO " + w.table + " (id) SELECT unnest($1::text[])"
	proc := processor.Func{ProcessorName: "ledger", Fn: func(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
		ids := make([]string, len(b.Records))
		for i, r := range b.Records {
			ids[i] = string(r.Key)
		}
		_, err := tx.Exec(ctx, insert, ids)
		return err
	}}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return engine.Run(ctx, cfg, engine.Options{Processor: proc, Logger: log})
}
