package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/config"
	"ratchet/processor/dashboard"
)

// scaleReport is the partition-count section (issue 18): the same
// exactly-once drain on topics with more and more partitions, the peak
// memory of `ratchet run` with the most of them, and what an idle instance
// owning them costs.
type scaleReport struct {
	partitions []int
	events     int64
	rounds     [][]drainResult // [round][i of partitions]
	mem        memResult       // `ratchet run`, the largest partition count, the large backlog
	memParts   int
	idle       idleResult
}

// scaleTopic is the input topic of the drains with n partitions.
func scaleTopic(n int) string { return fmt.Sprintf("scale-%d", n) }

// createTopics creates topics with their partition counts on the broker
// (`ratchet broker` creates every topic of its flag with one count).
func createTopics(ctx context.Context, brokers []string, topics map[string]int) error {
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": strings.Join(brokers, ","), "log_level": 3})
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer admin.Close()
	var specs []kafka.TopicSpecification
	for t, n := range topics {
		specs = append(specs, kafka.TopicSpecification{Topic: t, NumPartitions: n, ReplicationFactor: 1})
	}
	res, err := admin.CreateTopics(ctx, specs)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError {
			return fmt.Errorf("create topic %s: %w", r.Topic, r.Error)
		}
	}
	return nil
}

// scaleRound drains the backlog of every scale topic once, exactly-once
// with the dashboard, each with a fresh group, checking sum(count).
func scaleRound(ctx context.Context, env *benchEnv, r int, partitions []int, n int64) ([]drainResult, error) {
	out := make([]drainResult, len(partitions))
	for i, p := range partitions {
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return nil, err
		}
		d, err := drainStored(ctx, env, scaleTopic(p), fmt.Sprintf("bench-g%d-%d", p, r), n)
		if err != nil {
			return nil, fmt.Errorf("(g) %d partitions: %w", p, err)
		}
		if got, err := rollupCount(ctx, env); err != nil || got != n {
			return nil, fmt.Errorf("round %d (g) %d partitions: sum(count) is %d, want %d (%v)", r, p, got, n, err)
		}
		out[i] = d
	}
	return out, nil
}

// drainStored drains topic (n records) with the in-process engine at its
// defaults (exactly-once, dashboard) and times it from PostgreSQL: the
// first applied batch is the first count in the rollups, the end the moment
// the rollups count n events, both polled every 10 ms (results and offsets
// commit in one transaction). Neither the engine's registry nor the offset
// rows are read meanwhile: each grows with the partitions, so reading them
// every 10 ms costs the drains with more partitions more (gathering 1024
// partitions' series took a tenth of the CPU the drain had; summing 1024
// offset rows 100 times a second took PostgreSQL CPU the 12-partition
// drain did not pay), while the rollups are the same few rows whatever the
// partition count.
func drainStored(ctx context.Context, env *benchEnv, topic, group string, n int64) (drainResult, error) {
	cfg := env.config(env.brokers, topic, group, config.ModeExactlyOnce)
	e := startEngine(ctx, cfg, dashboard.New(), env.engineLog)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(10 * time.Minute)
	var first, last time.Time
	var cpu0 cpuSample
	var cpu cpuUse
	var err error
loop:
	for {
		select {
		case err = <-e.done:
			e.done <- err
			err = fmt.Errorf("engine stopped early: %v", err)
			break loop
		case <-ctx.Done():
			err = ctx.Err()
			break loop
		case now := <-t.C:
			got, qerr := rollupCount(ctx, env)
			if qerr != nil {
				continue
			}
			if got > 0 && first.IsZero() {
				first, cpu0 = now, sampleCPU(env.brokerPID)
			}
			if got >= n {
				last, cpu = now, sampleCPU(env.brokerPID).since(cpu0)
				break loop
			}
			if now.After(deadline) {
				err = fmt.Errorf("%d of %d stored after 10m", got, n)
				break loop
			}
		}
	}
	if serr := e.stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return drainResult{}, err
	}
	return drainResult{Events: n, Wall: last.Sub(e.start), Steady: last.Sub(first), CPU: cpu}, nil
}

// WallRate is events per second from the engine's start to the last
// record applied: group join and claims included, as a user sees it.
func (r drainResult) WallRate() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Events) / r.Wall.Seconds()
}

// FirstBatch is the time from the engine's start to its first applied
// batch.
func (r drainResult) FirstBatch() time.Duration { return r.Wall - r.Steady }

// idleResult is what an idle `ratchet run` owning many partitions costs.
type idleResult struct {
	Partitions int
	Cores      float64 // CPU in use, in cores, over Window
	Window     time.Duration
	// Claims is the claim calls the instance logged ("partitions
	// claimed"), each one statement per 1024 partitions, and ClaimTook
	// how long they took together.
	Claims    int
	Claimed   int
	ClaimTook time.Duration
	ToClaimed time.Duration // from the start to every partition claimed
}

// measureIdle starts `ratchet run` on topic (partitions partitions, no
// records), waits until it has claimed every partition and settle has
// passed, and measures its CPU over window.
func measureIdle(ctx context.Context, env *benchEnv, topic, group string, partitions int, settle, window time.Duration) (idleResult, error) {
	logPath := env.outPath("ratchet-run-" + topic + ".log")
	_ = os.Remove(logPath)
	start := time.Now()
	p, err := startRatchet(env.ratchetBin, env.runVars(topic, group, "info"), logPath)
	if err != nil {
		return idleResult{}, err
	}
	res := idleResult{Partitions: partitions}
	if err := p.waitUntil(ctx, logPath, 50*time.Millisecond, 5*time.Minute, func() (bool, string, error) {
		var n int
		err := env.db.pool.QueryRow(ctx, "SELECT count(*) FROM ratchet_offsets WHERE consumer_group = $1 AND topic = $2",
			group, topic).Scan(&n)
		return n >= partitions, fmt.Sprintf("%d of %d partitions claimed", n, partitions), err
	}); err != nil {
		return idleResult{}, err
	}
	res.ToClaimed = time.Since(start)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		_ = p.stop(30 * time.Second)
		return idleResult{}, ctx.Err()
	}
	pid := p.cmd.Process.Pid
	m0, t0 := readCPUStat(), procTicks(pid)
	w0 := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		_ = p.stop(30 * time.Second)
		return idleResult{}, ctx.Err()
	}
	m1, t1 := readCPUStat(), procTicks(pid)
	res.Window = time.Since(w0)
	if total := m1.total - m0.total; total > 0 {
		// The machine's total grows by one tick per CPU per tick.
		res.Cores = (t1 - t0) * float64(m1.cpus) / total
	}
	if err := p.stop(60 * time.Second); err != nil {
		return idleResult{}, fmt.Errorf("stop idle ratchet run: %w", err)
	}
	res.Claims, res.Claimed, res.ClaimTook = claimLines(logPath)
	return res, nil
}

// claimLines reads the "partitions claimed" lines of a JSON log.
func claimLines(path string) (calls, partitions int, took time.Duration) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.Contains(l, `"msg":"partitions claimed"`) {
			continue
		}
		calls++
		var n int
		if i := strings.Index(l, `"partitions":`); i >= 0 {
			fmt.Sscanf(l[i+len(`"partitions":`):], "%d", &n)
		}
		partitions += n
		if i := strings.Index(l, `"took":"`); i >= 0 {
			s := l[i+len(`"took":"`):]
			if j := strings.IndexByte(s, '"'); j >= 0 {
				d, _ := time.ParseDuration(s[:j])
				took += d
			}
		}
	}
	return calls, partitions, took
}

// scaleRows are the section's rows of the results table.
func (s *scaleReport) rows(row func(cells ...string)) {
	if s == nil || len(s.rounds) == 0 {
		return
	}
	perRound := func(i int, f func(drainResult) float64, format string) (string, float64) {
		var xs []float64
		var parts []string
		for _, r := range s.rounds {
			v := f(r[i])
			xs = append(xs, v)
			parts = append(parts, fmt.Sprintf(format, v))
		}
		return strings.Join(parts, ", "), median(xs)
	}
	for i, p := range s.partitions {
		rs, v := perRound(i, drainResult.WallRate, "%.0f")
		row(fmt.Sprintf("(g) exactly-once, dashboard, %d partitions, %d-event backlog, start → last row (group join included)", p, s.events),
			fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	}
	for i, p := range s.partitions {
		if i == 0 {
			continue
		}
		var xs []float64
		var parts []string
		for _, r := range s.rounds {
			v := r[i].WallRate() / r[0].WallRate()
			xs = append(xs, v)
			parts = append(parts, fmt.Sprintf("%.2f", v))
		}
		v := median(xs)
		row(fmt.Sprintf("(g) %d partitions / %d partitions", p, s.partitions[0]), fmt.Sprintf("%.2f (rounds: %s)", v, strings.Join(parts, ", ")),
			"≥ 0.8", passMiss(v >= 0.8))
	}
	for i, p := range s.partitions {
		rs, v := perRound(i, func(d drainResult) float64 { return float64(d.FirstBatch()) / float64(time.Millisecond) }, "%.0f")
		row(fmt.Sprintf("(g) start → first applied batch, %d partitions", p), fmt.Sprintf("%.0f ms (rounds: %s)", v, rs), "reported", "")
	}
	if s.mem.Events > 0 {
		row(fmt.Sprintf("peak RSS, `ratchet run`, %d partitions, %d backlog, defaults", s.memParts, s.mem.Events),
			fmt.Sprintf("%.1f MiB (drained in %s)", s.mem.PeakMiB, s.mem.Elapsed.Round(time.Millisecond)), "≤ 200 MiB", passMiss(s.mem.PeakMiB <= 200))
	}
	if s.idle.Partitions > 0 {
		row(fmt.Sprintf("idle `ratchet run` owning %d partitions: CPU", s.idle.Partitions),
			fmt.Sprintf("%.2f %% of a core (over %s)", 100*s.idle.Cores, s.idle.Window.Round(time.Second)), "≤ 2 %", passMiss(s.idle.Cores <= 0.02))
		row(fmt.Sprintf("claims of %d partitions at start (exactly-once)", s.idle.Partitions),
			fmt.Sprintf("%d claim call(s) for %d partitions, %s; all claimed %s after the start", s.idle.Claims, s.idle.Claimed,
				s.idle.ClaimTook.Round(time.Millisecond), s.idle.ToClaimed.Round(time.Millisecond)),
			"one statement per 1024 partitions", passMiss(s.idle.Claims > 0 && s.idle.Claims <= (s.idle.Partitions+1023)/1024))
	}
}

// method describes the section for the results file.
func (s *scaleReport) method() string {
	if s == nil || len(s.rounds) == 0 {
		return ""
	}
	var ps []string
	for _, p := range s.partitions {
		ps = append(ps, fmt.Sprint(p))
	}
	return fmt.Sprintf("- Partition counts (g): topics with %s partitions, created through the admin API, each preloaded with %d events; %d rounds, each draining every topic with the in-process engine at its defaults (exactly-once, dashboard) and a fresh group, `sum(count)` checked. Progress is read from `ratchet_offsets` every 10 ms (not from the engine's registry, whose size grows with the partitions). Rate = events / (the moment the stored offsets add up to the backlog − the engine's start), so the group join and the claims count, as a user sees them; start → first applied batch is the time until the first stored offset moved. Peak RSS: as Memory below, `ratchet run` on a topic with %d partitions and a %d-event backlog. Idle: `ratchet run` on an empty topic with %d partitions; once `ratchet_offsets` holds a row for each and %s more have passed, its user + system time (`/proc/<pid>/stat`, librdkafka's threads included) over %s; the claim calls are its `partitions claimed` log lines.\n",
		strings.Join(ps, ", "), s.events, len(s.rounds), s.memParts, s.mem.Events, s.idle.Partitions, idleSettle, s.idle.Window.Round(time.Second))
}

// How long an idle instance settles after its claims, and how long its CPU
// is measured.
const (
	idleSettle = 10 * time.Second
	idleWindow = 30 * time.Second
)
