package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/internal/produce"
	"ratchet/processor/dashboard"
)

// commitResult is the OffsetCommit load one engine puts on the broker.
type commitResult struct {
	TargetRate   float64
	AchievedRate float64 // records applied per second in the window
	Commits      int64
	Window       time.Duration
}

// PerSecond is OffsetCommit requests per second in the window.
func (r commitResult) PerSecond() float64 { return float64(r.Commits) / r.Window.Seconds() }

// measureCommits runs an in-process kfake broker that counts OffsetCommit
// requests (and passes them through), and an in-process engine at its
// defaults (exactly-once, dashboard, commit.interval 1s) fed at rate; it
// counts the requests during window after warmup.
func measureCommits(ctx context.Context, env *benchEnv, rate float64, warmup, window time.Duration, group string) (commitResult, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(12, "events", "events.dlq"))
	if err != nil {
		return commitResult{}, fmt.Errorf("kfake: %w", err)
	}
	defer c.Close()
	var commits atomic.Int64
	c.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		commits.Add(1)
		return nil, nil, false
	})
	brokers := c.ListenAddrs()
	cfg := env.config(brokers, "events", group, config.ModeExactlyOnce)
	e := startEngine(ctx, cfg, dashboard.New(), env.engineLog)
	defer func() { _ = e.stop() }()

	pctx, stopProducer := context.WithCancel(ctx)
	defer stopProducer()
	perr := make(chan error, 1)
	go func() { // ends when stopProducer is called
		_, err := produce.Run(pctx, produce.Options{Brokers: brokers, Topic: "events", Rate: rate, Seed: int64(rate)}, env.engineLog)
		perr <- err
	}()
	select {
	case <-time.After(warmup):
	case err := <-perr:
		return commitResult{}, fmt.Errorf("producer stopped: %v", err)
	}
	c0, r0, t0 := commits.Load(), e.counter("ratchet_records_total"), time.Now()
	select {
	case <-time.After(window):
	case err := <-perr:
		return commitResult{}, fmt.Errorf("producer stopped: %v", err)
	}
	c1, r1, t1 := commits.Load(), e.counter("ratchet_records_total"), time.Now()
	stopProducer()
	<-perr
	return commitResult{TargetRate: rate, AchievedRate: (r1 - r0) / t1.Sub(t0).Seconds(), Commits: c1 - c0, Window: t1.Sub(t0)}, nil
}
