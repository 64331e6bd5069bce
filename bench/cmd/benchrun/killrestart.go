package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"ratchet/internal/produce"
)

// Section (k): how long an instance restarted after kill -9 waits before
// it applies its first batch, with static membership (kafka.instance_id)
// and without (issue 32, item 2). Without it the group waits for the dead
// member's session to expire (session.timeout.ms, 30 s by default) before
// it assigns anything, and the broker (kfake) may wait longer still
// (PITFALLS D3); with it the new instance takes its old member's place.

// killTopics are the section's topics, one per contestant.
var killTopics = []string{"kill-static", "kill-dynamic"}

// killReport holds section (k): per contestant, the restart-to-first-batch
// time of each cycle.
type killReport struct {
	Rate    float64
	Cycles  int
	Static  []time.Duration
	Dynamic []time.Duration
}

// runKillRestart runs the section: for each contestant a producer writes
// rate events/s to its topic, one ratchet worker (exactly-once, a ledger
// processor, defaults otherwise) applies them, and cycles times it is
// killed with SIGKILL and started again at once; each restart is timed
// from the new process's start to the first row it adds to the ledger.
func runKillRestart(ctx context.Context, env *benchEnv, rate float64, cycles int, say func(string, ...any)) (*killReport, error) {
	rep := &killReport{Rate: rate, Cycles: cycles}
	for i, topic := range killTopics {
		static := i == 0
		instance := ""
		if static {
			instance = topic + "-0"
		}
		times, err := killCycles(ctx, env, topic, instance, rate, cycles, say)
		if err != nil {
			return nil, err
		}
		if static {
			rep.Static = times
		} else {
			rep.Dynamic = times
		}
	}
	return rep, nil
}

func killCycles(ctx context.Context, env *benchEnv, topic, instance string, rate float64, cycles int,
	say func(string, ...any)) ([]time.Duration, error) {
	table := "ledger_" + strings.ReplaceAll(topic, "-", "_")
	if _, err := env.db.pool.Exec(ctx, "CREATE TABLE "+table+" (id text NOT NULL)"); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	rows := func() (int64, error) {
		var n int64
		err := env.db.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
		return n, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"worker-ratchet", "-brokers", strings.Join(env.brokers, ","), "-topic", topic,
		"-group", "bench-" + topic, "-db", env.db.url, "-table", table, "-instance", instance}
	logPath := env.outPath("worker-" + topic + ".log")
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
	// grows waits until the ledger holds more than n rows; it returns how
	// long that took.
	grows := func(p *ratchetProc, n int64, within time.Duration) (time.Duration, error) {
		began := time.Now()
		for {
			got, err := rows()
			if err != nil {
				return 0, err
			}
			if got > n {
				return time.Since(began), nil
			}
			select {
			case err := <-p.done:
				return 0, fmt.Errorf("%s worker exited: %v (see %s)", topic, err, logPath)
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			if time.Since(began) > within {
				return 0, fmt.Errorf("%s: no batch applied within %s (see %s)", topic, within, logPath)
			}
		}
	}

	pctx, stopProducer := context.WithCancel(ctx)
	defer stopProducer()
	pdone := make(chan error, 1)
	go func() { // ends when stopProducer is called
		_, err := produce.Run(pctx, produce.Options{Brokers: env.brokers, Topic: topic, Rate: rate, Seed: 4343}, env.engineLog)
		pdone <- err
	}()
	defer func() { stopProducer(); <-pdone }()

	p, err := start()
	if err != nil {
		return nil, err
	}
	if _, err := grows(p, 0, 2*time.Minute); err != nil {
		_ = p.stop(time.Minute)
		return nil, err
	}
	var times []time.Duration
	for c := 1; c <= cycles; c++ {
		// Running and applying: kill it mid-stream.
		n, err := rows()
		if err == nil {
			_, err = grows(p, n, time.Minute)
		}
		if err != nil {
			_ = p.stop(time.Minute)
			return nil, err
		}
		_ = p.cmd.Process.Kill()
		<-p.done
		// A COMMIT the killed process had sent may still land: count the
		// ledger once its connections are gone.
		if err := waitNoBackends(ctx, env); err != nil {
			return nil, err
		}
		n, err = rows()
		if err != nil {
			return nil, err
		}
		if p, err = start(); err != nil {
			return nil, err
		}
		d, err := grows(p, n, 5*time.Minute)
		if err != nil {
			_ = p.stop(time.Minute)
			return nil, err
		}
		times = append(times, d)
		say("(k) %s cycle %d: kill -9, restart to first batch %s", topic, c, d.Round(time.Millisecond))
	}
	_ = p.stop(time.Minute)
	return times, nil
}

// waitNoBackends waits until no connection of an engine (application_name
// engineApp) is left in the bench database.
func waitNoBackends(ctx context.Context, env *benchEnv) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := env.db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, engineApp).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d engine connections still open 30 s after kill -9", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func medianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func (k *killReport) rows(row func(cells ...string)) {
	if k == nil {
		return
	}
	for _, c := range []struct {
		what  string
		times []time.Duration
	}{{"with `kafka.instance_id`", k.Static}, {"without `kafka.instance_id`", k.Dynamic}} {
		all := make([]string, len(c.times))
		for i, d := range c.times {
			all[i] = roundRestart(d)
		}
		row(fmt.Sprintf("(k) kill -9, restart to first batch, %s (median of %d; each)", c.what, len(c.times)),
			fmt.Sprintf("%s (%s)", roundRestart(medianDuration(c.times)), strings.Join(all, ", ")), "", "")
	}
}

// roundRestart keeps two significant figures or so: 640ms, 29.5s.
func roundRestart(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

func (k *killReport) method() string {
	if k == nil {
		return ""
	}
	return fmt.Sprintf("- (k) Restart after kill -9: a producer writes %.0f events/s to the contestant's own topic (12 partitions); one ratchet worker (a subprocess: exactly-once, defaults, session.timeout.ms 30 s, a processor appending each id to a ledger table) applies them; %d times it is killed with SIGKILL while applying, and once PostgreSQL has dropped its connections a new one is started at once. Timed from the new process's start to the first row it adds to the ledger. With `kafka.instance_id` the new instance takes its old member's place; without it the group waits for the dead member's session to expire (the broker is kfake, `ratchet broker`; PITFALLS D3).\n",
		k.Rate, k.Cycles)
}
