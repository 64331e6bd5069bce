// Command benchrun is `make bench`: it starts `ratchet broker` as a separate
// process and a fresh PostgreSQL database, preloads a backlog, and measures,
// side by side in one run, the drain throughput of a bare consumer, of
// ratchet in both commit modes and of the naive per-record loop; latency at
// a steady rate; the peak memory of `ratchet run`; the OffsetCommit load on
// the broker; and replays and losses through SIGTERM/restart cycles. It
// prints a table and writes it, with the machine and versions, to
// bench/results.md.
//
// The subcommands worker-naive and worker-ratchet are the processes the
// restart cycles start; they are not meant to be run by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"ratchet/config"
	"ratchet/internal/gcpolicy"
	"ratchet/internal/produce"
	"ratchet/processor/dashboard"
)

// benchEnv is what every measurement shares.
type benchEnv struct {
	ratchetBin string
	brokers    []string
	db         *database
	engineLog  *slog.Logger
	outDir     string
	// maxBuffered overrides processing.max_buffered_per_partition when > 0.
	maxBuffered int
	brokerPID   int // the `ratchet broker` process, for its CPU time
}

func (e *benchEnv) outPath(name string) string { return filepath.Join(e.outDir, name) }

// checkpoint makes PostgreSQL write out what earlier runs left dirty
// (CHECKPOINT) before a timed run writes, so that no run pays for another's
// pages, nor for a checkpoint that max_wal_size sets off in its middle,
// and every run starts with the same full-page writes after a checkpoint.
// The sections that set a pipeline against a direct loop (j2, j3, l) call
// it before each side's run.
func (e *benchEnv) checkpoint(ctx context.Context) error {
	if _, err := e.db.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint before a timed run: %w", err)
	}
	return nil
}

func main() {
	// The in-process engines run with the collector `ratchet run` sets
	// (package gcpolicy), and so do the baselines beside them in this
	// process; the soft memory limit is ratchet run's alone (its memory
	// rows), for this process also holds the direct loops' rows.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcpolicy.Percent)
	}
	if len(os.Args) > 1 {
		if worker, ok := workers[os.Args[1]]; ok {
			if err := worker(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "worker:", err)
				os.Exit(1)
			}
			return
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// workers are the subcommands the restart cycles start.
var workers = map[string]func(args []string) error{
	"worker-naive":   naiveWorker,
	"worker-ratchet": ratchetWorker,
}

// options are benchrun's flags.
type options struct {
	ratchetBin   string
	events       int64
	memSmall     int64
	memLarge     int64
	rounds       int
	naiveFor     time.Duration
	latRate      float64
	latFor       time.Duration
	cycles       int
	cycleRun     time.Duration
	out          string
	outDir       string
	pgAdmin      string
	command      string
	skipRewinds  bool
	forceProfile bool
	maxBuffered  int
	// The partition-count section (scale.go).
	scaleEvents int64
	scaleParts  string
	onlyScale   bool
	// The query exec mode section (execmode.go).
	onlyExecMode bool
	// The tracing section (tracing.go).
	onlyTracing bool
	// The configured-pipelines section (pipelines.go).
	onlyPipelines  bool
	onlyAppend     bool
	onlyPoison     bool
	pipelineOrders int64
	// The restart-after-kill section (killrestart.go).
	onlyKill   bool
	killCycles int
	killRate   float64
	// The PostgreSQL-rate section (pgrate.go).
	onlyPGRate    bool
	pgRateRecords int64
	pgRateTx      string
	pgRatePin     bool
}

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.ratchetBin, "ratchet", "bin/ratchet", "the ratchet binary built from this repository")
	flag.Int64Var(&o.events, "events", 1_000_000, "drain backlog size")
	flag.Int64Var(&o.memSmall, "mem-small", 200_000, "small memory backlog")
	flag.Int64Var(&o.memLarge, "mem-large", 2_000_000, "large memory backlog")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved drain rounds (the median is reported)")
	flag.DurationVar(&o.naiveFor, "naive-for", 15*time.Second, "how long the naive loop runs per round")
	flag.Float64Var(&o.latRate, "latency-rate", 20000, "steady rate of the latency run")
	flag.DurationVar(&o.latFor, "latency-for", 20*time.Second, "length of the latency run")
	flag.IntVar(&o.cycles, "cycles", 10, "SIGTERM/restart cycles per contestant")
	flag.DurationVar(&o.cycleRun, "cycle-run", 6*time.Second, "how long each instance runs before SIGTERM")
	flag.StringVar(&o.out, "out", "bench/results.md", "results file")
	flag.StringVar(&o.outDir, "out-dir", "bench/out", "logs and profiles")
	flag.StringVar(&o.pgAdmin, "postgres", envOr("RATCHET_BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"URL of an existing database on the server to create the bench database on")
	flag.StringVar(&o.command, "command", "", "the command line to record in the results")
	flag.BoolVar(&o.skipRewinds, "skip-rewinds", false, "skip the restart cycles")
	flag.BoolVar(&o.forceProfile, "profile", false, "profile ratchet's drains even when the targets are met")
	flag.IntVar(&o.maxBuffered, "max-buffered", 0, "processing.max_buffered_per_partition for every ratchet run (0: the default)")
	flag.Int64Var(&o.scaleEvents, "scale-events", 1_000_000, "backlog of each partition-count drain (g)")
	flag.StringVar(&o.scaleParts, "scale-partitions", "12,256,1024", "partition counts of the drains (g), the first the baseline, the last also for peak RSS and idle CPU")
	flag.BoolVar(&o.onlyScale, "only-scale", false, "run the partition-count section alone (to develop it; the table then has its rows only)")
	flag.BoolVar(&o.onlyExecMode, "only-exec-mode", false, "run the query exec mode section (h) alone on a -events backlog (the table then has its rows only)")
	flag.BoolVar(&o.onlyTracing, "only-tracing", false, "run the tracing section (i) alone on a -events backlog (the table then has its rows only)")
	flag.BoolVar(&o.onlyPipelines, "only-pipelines", false, "run the configured-pipelines section (j) alone on a -events backlog (the table then has its rows only)")
	flag.BoolVar(&o.onlyAppend, "only-append", false, "run the append section (j2) alone on -pipeline-orders JSON orders (the table then has its rows only)")
	flag.BoolVar(&o.onlyPoison, "only-poison", false, "run the poison section (j3) alone on -pipeline-orders JSON orders, clean and with 1 % refused by the pipeline (the table then has its rows only)")
	flag.BoolVar(&o.onlyKill, "only-kill-restart", false, "run the restart-after-kill -9 section (k) alone (the table then has its rows only)")
	flag.IntVar(&o.killCycles, "kill-cycles", 3, "kill -9 and restart cycles per contestant (k)")
	flag.Float64Var(&o.killRate, "kill-rate", 1000, "events/s produced while the (k) workers are killed and restarted")
	flag.BoolVar(&o.onlyPGRate, "only-pg-rate", false, "run the PostgreSQL-rate section (l) alone on -pg-rate-records orders per format (the table then has its rows only)")
	// 400,000: at 200,000 a drain lasts about a second, and PostgreSQL's
	// share of it was up to a third start-up work (sixteen backends
	// forked, authenticated, their caches and functions loaded), not rows.
	flag.Int64Var(&o.pgRateRecords, "pg-rate-records", 400_000, "orders per format of the PostgreSQL-rate section (l)")
	flag.BoolVar(&o.pgRatePin, "pg-rate-pin", true, "run sections (l) and (j2) a second time with PostgreSQL pinned to CPU 0 and the client and broker to the other CPUs (needs root and 2+ CPUs; skipped with a note otherwise)")
	flag.StringVar(&o.pgRateTx, "pg-rate-tx", "", "rows per transaction at which (l) runs its direct JSON upsert loop once more, e.g. 500,2000,5000 (empty: none)")
	flag.Int64Var(&o.pipelineOrders, "pipeline-orders", 200_000, "orders of each upsert pipeline drain (j)")
	flag.Parse()
	if o.command == "" {
		o.command = fmt.Sprint(os.Args)
	}
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(o.outDir, "bench.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	engineLog := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn}))
	say := func(format string, args ...any) {
		line := fmt.Sprintf("%s  "+format, append([]any{time.Now().Format("15:04:05")}, args...)...)
		fmt.Println(line)
		fmt.Fprintln(logFile, line)
	}
	began := time.Now()
	rep := &report{opts: o, began: began}
	rep.machine = machineInfo()

	rwTopics := []string{"rw-naive", "rw-naive-commit", "rw-ratchet"}
	topics := []string{"events", "events.dlq", "poison", "poison.dlq", "lat", "lat.dlq", "mem-s", "mem-s.dlq", "mem-l", "mem-l.dlq",
		tracedTopic, tracedTopic + ".dlq"}
	topics = append(topics, rwTopics...)
	topics = append(topics, pipelineTopics...)
	topics = append(topics, poisonTopics...)
	topics = append(topics, killTopics...)
	topics = append(topics, pgRateTopics...)
	brokerLog, err := os.Create(filepath.Join(o.outDir, "broker.log"))
	if err != nil {
		return err
	}
	defer brokerLog.Close()
	b, err := startBroker(ctx, o.ratchetBin, topics, 12, brokerLog)
	if err != nil {
		return err
	}
	defer b.stop()
	say("broker %s (pid %d, `%s broker`)", b.addr, b.cmd.Process.Pid, o.ratchetBin)
	db, err := createDatabase(ctx, o.pgAdmin)
	if err != nil {
		return err
	}
	defer db.drop(context.Background())
	say("database %s", db.name)
	rep.pgVersion = pgVersion(ctx, db)
	env := &benchEnv{ratchetBin: o.ratchetBin, brokers: []string{b.addr}, db: db, engineLog: engineLog, outDir: o.outDir,
		maxBuffered: o.maxBuffered, brokerPID: b.cmd.Process.Pid}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	scaleParts, err := parseCounts("-scale-partitions", o.scaleParts)
	if err != nil {
		return err
	}
	if o.onlyScale {
		if rep.scale, err = runScale(ctx, env, o, scaleParts, say, quiet); err != nil {
			return err
		}
		return rep.write(began, say)
	}
	if o.onlyTracing {
		if rep.tracing, err = runTracing(ctx, env, o.events, o.rounds, say); err != nil {
			return err
		}
		return rep.write(began, say)
	}
	if o.onlyKill {
		if rep.kill, err = runKillRestart(ctx, env, o.killRate, o.killCycles, say); err != nil {
			return err
		}
		return rep.write(began, say)
	}
	if o.onlyPipelines {
		d, err := preload(ctx, env.brokers, "events", o.events, 1, quiet)
		if err != nil {
			return err
		}
		say("preloaded %d events to events in %s", o.events, d.Round(time.Millisecond))
		rep.preload = append(rep.preload, fmt.Sprintf("%d events to `events` in %s", o.events, d.Round(time.Millisecond)))
		if rep.pipelines, err = runPipelines(ctx, env, o.events, o.pipelineOrders, o.rounds, say); err != nil {
			return err
		}
		return rep.write(began, say)
	}
	var pgRateTx []int
	if o.pgRateTx != "" {
		if pgRateTx, err = parseCounts("-pg-rate-tx", o.pgRateTx); err != nil {
			return err
		}
	}
	if o.onlyPGRate {
		if err := pgRateSection(ctx, env, o, rep, pgRateTx, say); err != nil {
			return err
		}
		return rep.write(began, say)
	}
	if o.onlyAppend {
		if err := appendSection(ctx, env, o, rep, false, say); err != nil {
			return err
		}
		return rep.write(began, say)
	}
	if o.onlyPoison {
		if rep.poisoned, err = runPoison(ctx, env, o.pipelineOrders, o.rounds, o.forceProfile, say); err != nil {
			return err
		}
		return rep.write(began, say)
	}
	if o.onlyExecMode {
		d, err := preload(ctx, env.brokers, "events", o.events, 1, quiet)
		if err != nil {
			return err
		}
		say("preloaded %d events to events in %s", o.events, d.Round(time.Millisecond))
		rep.preload = append(rep.preload, fmt.Sprintf("%d events to `events` in %s", o.events, d.Round(time.Millisecond)))
		if rep.execMode, err = runExecMode(ctx, env, "events", o.events, o.rounds, say); err != nil {
			return err
		}
		return rep.write(began, say)
	}

	// 1. Backlogs.
	for _, bl := range []struct {
		topic string
		n     int64
	}{{"events", o.events}, {"mem-s", o.memSmall}, {"mem-l", o.memLarge}} {
		d, err := preload(ctx, env.brokers, bl.topic, bl.n, 1, quiet)
		if err != nil {
			return err
		}
		say("preloaded %d events to %s in %s (%.0f/s)", bl.n, bl.topic, d.Round(time.Millisecond), float64(bl.n)/d.Seconds())
		rep.preload = append(rep.preload, fmt.Sprintf("%d events to `%s` in %s (%.0f events/s)", bl.n, bl.topic, d.Round(time.Millisecond), float64(bl.n)/d.Seconds()))
	}
	// The same size of backlog with 1 % poison records of three kinds.
	pstart := time.Now()
	pst, err := produce.Run(ctx, produce.Options{Brokers: env.brokers, Topic: "poison", Rate: 0, Count: o.events,
		Seed: 2, PoisonFraction: 0.01}, quiet)
	if err != nil {
		return fmt.Errorf("preload poison: %w", err)
	}
	rep.poison = pst.Poison
	say("preloaded %d events (%d poison) to poison in %s", pst.Produced, pst.Poison, time.Since(pstart).Round(time.Millisecond))
	rep.preload = append(rep.preload, fmt.Sprintf("%d events, %d of them poison, to `poison`", pst.Produced, pst.Poison))
	rep.brokerRSS = b.rssMiB()
	say("broker RSS after preload: %.0f MiB", rep.brokerRSS)

	// 2. Drains, interleaved.
	for r := 1; r <= o.rounds; r++ {
		cpu0 := readCPUStat()
		a, err := drainCeiling(ctx, env, "events", fmt.Sprintf("bench-a-%d", r), o.events, false)
		if err != nil {
			return err
		}
		say("round %d (a) ceiling:           %9.0f events/s (wall %s), %s", r, a.Rate(), a.Wall.Round(time.Millisecond), a.cpuLine())
		a2, err := drainCeiling(ctx, env, "events", fmt.Sprintf("bench-a2-%d", r), o.events, true)
		if err != nil {
			return err
		}
		say("round %d (a') ceiling + decode: %9.0f events/s (wall %s), %s", r, a2.Rate(), a2.Wall.Round(time.Millisecond), a2.cpuLine())
		bres, err := drainRatchet(ctx, env, "events", fmt.Sprintf("bench-b-%d", r), config.ModeAtLeastOnce, noop, o.events, "")
		if err != nil {
			return err
		}
		say("round %d (b) at-least-once noop: %9.0f events/s (wall %s), %.1f partitions in a transaction, %s", r, bres.Rate(), bres.Wall.Round(time.Millisecond), bres.inTx(), bres.cpuLine())
		if _, err := db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return err
		}
		c, err := drainRatchet(ctx, env, "events", fmt.Sprintf("bench-c-%d", r), config.ModeExactlyOnce, dashboard.New(), o.events, "")
		if err != nil {
			return err
		}
		if got, err := rollupCount(ctx, env); err != nil || got != o.events {
			return fmt.Errorf("round %d (c): sum(count) in dashboard_rollups is %d, want %d (%v)", r, got, o.events, err)
		}
		say("round %d (c) exactly-once dash:  %9.0f events/s (wall %s), sum(count)=%d, %.1f partitions in a transaction, %s", r, c.Rate(), c.Wall.Round(time.Millisecond), o.events, c.inTx(), c.cpuLine())
		if _, err := db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return err
		}
		f, err := drainRatchet(ctx, env, "events", fmt.Sprintf("bench-f-%d", r), config.ModeExactlyOnce, dashboard.New(), o.events, "",
			func(c *config.Config) { c.Postgres.SynchronousCommit = "off" })
		if err != nil {
			return err
		}
		if got, err := rollupCount(ctx, env); err != nil || got != o.events {
			return fmt.Errorf("round %d (f): sum(count) in dashboard_rollups is %d, want %d (%v)", r, got, o.events, err)
		}
		say("round %d (f) exactly-once, async:  %9.0f events/s (wall %s), sum(count)=%d, %.1f partitions in a transaction, %s", r, f.Rate(), f.Wall.Round(time.Millisecond), o.events, f.inTx(), f.cpuLine())
		if _, err := db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return err
		}
		good := o.events - rep.poison
		egroup := fmt.Sprintf("bench-e-%d", r)
		e, err := drainRatchet(ctx, env, "poison", egroup, config.ModeExactlyOnce, dashboard.New(), good, "")
		if err != nil {
			return err
		}
		e.Events = o.events // rate over every record read, poison included
		if got, err := rollupCount(ctx, env); err != nil || got != good {
			return fmt.Errorf("round %d (e): sum(count) is %d, want %d (%v)", r, got, good, err)
		}
		var dead int64
		if err := db.pool.QueryRow(ctx, "SELECT count(*) FROM ratchet_dead_letters WHERE consumer_group = $1", egroup).Scan(&dead); err != nil || dead != rep.poison {
			return fmt.Errorf("round %d (e): %d dead letters recorded, want %d (%v)", r, dead, rep.poison, err)
		}
		say("round %d (e) exactly-once, 1%% poison: %9.0f events/s (wall %s), %d dead-lettered, %.1f partitions in a transaction, %s", r, e.Rate(), e.Wall.Round(time.Millisecond), dead, e.inTx(), e.cpuLine())
		d, err := drainNaive(ctx, env, "events", fmt.Sprintf("bench-d-%d", r), o.naiveFor)
		if err != nil {
			return err
		}
		say("round %d (d) naive loop:         %9.0f events/s (%d in %s)", r, d.Rate(), d.Events, d.Steady.Round(time.Millisecond))
		steal := stealPercent(cpu0, readCPUStat())
		say("round %d: CPU steal %.0f %%", r, steal)
		rep.rounds = append(rep.rounds, round{a: a, a2: a2, b: bres, c: c, d: d, e: e, f: f, steal: steal})
	}

	// Profiles where a throughput target is missed.
	med := rep.medians()
	if o.forceProfile || med.b < 0.9*med.a {
		p := env.outPath("cpu-at-least-once.pprof")
		if _, err := drainRatchet(ctx, env, "events", "bench-b-prof", config.ModeAtLeastOnce, noop, o.events, p); err != nil {
			return err
		}
		rep.profiles = append(rep.profiles, profileTop("(b) at-least-once, no-op", p))
		say("profiled (b): %s", p)
	}
	if o.forceProfile || med.c < 0.7*med.a {
		p := env.outPath("cpu-exactly-once.pprof")
		if _, err := db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return err
		}
		stopSampling := samplePG(ctx, db.pool, 5*time.Millisecond)
		_, err := drainRatchet(ctx, env, "events", "bench-c-prof", config.ModeExactlyOnce, dashboard.New(), o.events, p)
		rep.pgStates = stopSampling()
		if err != nil {
			return err
		}
		say("(c) PostgreSQL connections of the engine, on average over %d samples: %s", rep.pgStates.samples, rep.pgStates)
		rep.profiles = append(rep.profiles, profileTop("(c) exactly-once, dashboard", p))
		say("profiled (c): %s", p)
	}
	if _, poisonRatio := rep.ratios(func(x round) float64 { return x.e.Rate() }, func(x round) float64 { return x.c.Rate() }); o.forceProfile || poisonRatio < 0.8 {
		p := env.outPath("cpu-poison.pprof")
		if _, err := db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return err
		}
		if _, err := drainRatchet(ctx, env, "poison", "bench-e-prof", config.ModeExactlyOnce, dashboard.New(), o.events-rep.poison, p); err != nil {
			return err
		}
		rep.profiles = append(rep.profiles, profileTop("(e) exactly-once, dashboard, 1 % poison", p))
		say("profiled (e): %s", p)
	}

	// 3. Latency.
	lat, err := measureLatency(ctx, env, "lat", "bench-lat", o.latRate, o.latFor, 2*time.Second)
	if err != nil {
		return err
	}
	rep.latency = lat
	say("latency at %.0f events/s: p50 %s p99 %s max %s (histogram p50 %s p99 %s)", lat.Rate,
		ms(lat.P50), ms(lat.P99), ms(lat.Max), ms(lat.HistP50), ms(lat.HistP99))

	// 4. Memory.
	small, err := measureMemory(ctx, env, "mem-s", "bench-mem-s", o.memSmall)
	if err != nil {
		return err
	}
	say("ratchet run, %d backlog: peak RSS %.1f MiB (drained in %s)", small.Events, small.PeakMiB, small.Elapsed.Round(time.Millisecond))
	large, err := measureMemory(ctx, env, "mem-l", "bench-mem-l", o.memLarge)
	if err != nil {
		return err
	}
	say("ratchet run, %d backlog: peak RSS %.1f MiB (drained in %s)", large.Events, large.PeakMiB, large.Elapsed.Round(time.Millisecond))
	rep.memSmall, rep.memLarge = small, large

	// 5. Partition counts (issue 18): drains, memory and idle cost with
	// many partitions.
	if rep.scale, err = runScale(ctx, env, o, scaleParts, say, quiet); err != nil {
		return err
	}

	// 5b. Query exec modes (issue 27): the session-free default against
	// named prepared statements, on the drains' backlog.
	if rep.execMode, err = runExecMode(ctx, env, "events", o.events, o.rounds, say); err != nil {
		return err
	}

	// 5c. Tracing (issue 26): off, on at 100 % and at 1 % sampling.
	if rep.tracing, err = runTracing(ctx, env, o.events, o.rounds, say); err != nil {
		return err
	}

	// 5d. Configured pipelines (issue 25): the dashboard as a pipeline
	// against the built-in one, and upsert pipelines on JSON and Avro.
	if rep.pipelines, err = runPipelines(ctx, env, o.events, o.pipelineOrders, o.rounds, say); err != nil {
		return err
	}
	// 5d2. An append pipeline (COPY) against a direct pgx CopyFrom loop,
	// on the JSON orders (j) preloaded.
	if err := appendSection(ctx, env, o, rep, true, say); err != nil {
		return err
	}
	// 5d3. 1 % of the JSON orders refused by the pipeline, taken out of
	// their batches (and split, for reference) against the clean drain.
	if rep.poisoned, err = runPoison(ctx, env, o.pipelineOrders, o.rounds, o.forceProfile, say); err != nil {
		return err
	}

	// 5d3. Against PostgreSQL's own rate (issue 33): upsert pipelines
	// against a direct pgx loop, rollups against a bare Poll loop.
	if err := pgRateSection(ctx, env, o, rep, pgRateTx, say); err != nil {
		return err
	}

	// 5e. Restart after kill -9 (issue 32), with and without
	// kafka.instance_id.
	if rep.kill, err = runKillRestart(ctx, env, o.killRate, o.killCycles, say); err != nil {
		return err
	}

	// 6. Commit load.
	for _, rate := range []float64{1000, 50000} {
		cr, err := measureCommits(ctx, env, rate, 5*time.Second, 10*time.Second, fmt.Sprintf("bench-commits-%.0f", rate))
		if err != nil {
			return err
		}
		say("commit load at %.0f events/s (applied %.0f/s): %d OffsetCommit in %s = %.2f/s", rate, cr.AchievedRate,
			cr.Commits, cr.Window.Round(time.Millisecond), cr.PerSecond())
		rep.commits = append(rep.commits, cr)
	}

	// 7. Rewinds.
	if !o.skipRewinds {
		rate := min(max(0.5*med.d, 200), 2000)
		rep.rewindRate = rate
		for _, ct := range []contestant{
			{name: "naive", args: []string{"worker-naive"}},
			{name: "naive-commit", args: []string{"worker-naive", "-commit-before-close"}},
			{name: "ratchet", args: []string{"worker-ratchet"}},
		} {
			rr, err := measureRewinds(ctx, env, ct, rate, o.cycles, o.cycleRun)
			if err != nil {
				return err
			}
			say("rewinds %-13s produced %d, applied %d: replayed %d, lost %d", ct.name, rr.Produced, rr.Applied, rr.Replayed(), rr.Lost())
			rep.rewinds = append(rep.rewinds, rr)
		}
	}

	return rep.write(began, say)
}

// write prints the table and writes the results file.
func (rep *report) write(began time.Time, say func(string, ...any)) error {
	rep.elapsed = time.Since(began)
	table := rep.table()
	fmt.Println()
	fmt.Println(table)
	fmt.Println(rep.cpuTable())
	if err := os.WriteFile(rep.opts.out, []byte(rep.markdown(table)), 0o644); err != nil {
		return err
	}
	say("wrote %s (%s in all)", rep.opts.out, rep.elapsed.Round(time.Second))
	return nil
}

// runScale is the partition-count section: it creates and preloads its
// topics, drains them in interleaved rounds, then measures the peak RSS of
// `ratchet run` and the idle cost with the largest count.
func runScale(ctx context.Context, env *benchEnv, o options, parts []int, say func(string, ...any), quiet *slog.Logger) (*scaleReport, error) {
	most := slices.Max(parts)
	memTopic, idleTopic := fmt.Sprintf("mem-%d", most), fmt.Sprintf("idle-%d", most)
	topics := map[string]int{memTopic: most, idleTopic: most}
	for _, p := range parts {
		topics[scaleTopic(p)] = p
	}
	if err := createTopics(ctx, env.brokers, topics); err != nil {
		return nil, err
	}
	for _, p := range parts {
		d, err := preload(ctx, env.brokers, scaleTopic(p), o.scaleEvents, 3, quiet)
		if err != nil {
			return nil, err
		}
		say("preloaded %d events to %s in %s", o.scaleEvents, scaleTopic(p), d.Round(time.Millisecond))
	}
	d, err := preload(ctx, env.brokers, memTopic, o.memLarge, 4, quiet)
	if err != nil {
		return nil, err
	}
	say("preloaded %d events to %s in %s", o.memLarge, memTopic, d.Round(time.Millisecond))

	s := &scaleReport{partitions: parts, events: o.scaleEvents, memParts: most}
	for r := 1; r <= o.rounds; r++ {
		res, err := scaleRound(ctx, env, r, parts, o.scaleEvents)
		if err != nil {
			return nil, err
		}
		for i, p := range parts {
			say("round %d (g) %4d partitions: %9.0f events/s start to last row (wall %s), first batch after %s, %.0f events/s first to last, %s",
				r, p, res[i].WallRate(), res[i].Wall.Round(time.Millisecond), res[i].FirstBatch().Round(time.Millisecond), res[i].Rate(), res[i].cpuLine())
		}
		s.rounds = append(s.rounds, res)
	}
	if s.mem, err = measureMemory(ctx, env, memTopic, fmt.Sprintf("bench-mem-%d", most), o.memLarge); err != nil {
		return nil, err
	}
	say("ratchet run, %d partitions, %d backlog: peak RSS %.1f MiB (drained in %s)", most, s.mem.Events, s.mem.PeakMiB, s.mem.Elapsed.Round(time.Millisecond))
	if s.idle, err = measureIdle(ctx, env, idleTopic, fmt.Sprintf("bench-idle-%d", most), most, idleSettle, idleWindow); err != nil {
		return nil, err
	}
	say("idle ratchet run owning %d partitions: %.2f %% of a core over %s; %d claim call(s) for %d partitions in %s, all claimed %s after the start",
		most, 100*s.idle.Cores, s.idle.Window.Round(time.Second), s.idle.Claims, s.idle.Claimed, s.idle.ClaimTook.Round(time.Millisecond),
		s.idle.ToClaimed.Round(time.Millisecond))
	return s, nil
}

// parseCounts parses a comma-separated list of positive integers.
func parseCounts(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &n); err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", name, f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty", name)
	}
	return out, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// appendSection runs section (j2) on o.pipelineOrders JSON orders (preloaded
// or not), profiles it when it misses or -profile asks, then runs it again
// with PostgreSQL pinned (pin.go).
func appendSection(ctx context.Context, env *benchEnv, o options, rep *report, preloaded bool, say func(string, ...any)) error {
	var profiles []string
	var err error
	if rep.appendSink, profiles, err = runAppend(ctx, env, o.pipelineOrders, o.rounds, preloaded, o.forceProfile, false, say); err != nil {
		return err
	}
	rep.profiles = append(rep.profiles, profiles...)
	return pinnedSection(o, "(j2)", say, func() (err error) {
		rep.appendSinkPinned, _, err = runAppend(ctx, env, o.pipelineOrders, o.rounds, true, false, true, say)
		return err
	}, func(why string) { rep.appendSinkPinned = &appendReport{pinned: true, skipped: why} })
}

// pgRateSection runs section (l), with the direct loop once more at each of
// txSizes rows per transaction, profiles it as appendSection does, then
// runs it again with PostgreSQL pinned (pin.go).
func pgRateSection(ctx context.Context, env *benchEnv, o options, rep *report, txSizes []int, say func(string, ...any)) error {
	var profiles []string
	var err error
	if rep.pgRate, profiles, err = runPGRate(ctx, env, o.pgRateRecords, o.rounds, txSizes, o.forceProfile, false, say); err != nil {
		return err
	}
	rep.profiles = append(rep.profiles, profiles...)
	return pinnedSection(o, "(l)", say, func() (err error) {
		rep.pgRatePinned, _, err = runPGRate(ctx, env, o.pgRateRecords, o.rounds, nil, false, true, say)
		return err
	}, func(why string) { rep.pgRatePinned = &pgRateReport{pinned: true, skipped: why} })
}

// pinnedSection runs a section again with PostgreSQL pinned when
// -pg-rate-pin: run does it; a machine where pinning cannot be done (one
// CPU, no permission) gets skipped's note instead of the rows.
func pinnedSection(o options, section string, say func(string, ...any), run func() error, skipped func(why string)) error {
	if !o.pgRatePin {
		return nil
	}
	err := run()
	if pinErr := (*pinError)(nil); errors.As(err, &pinErr) {
		say("%s pinned: skipped: %v", section, err)
		skipped(err.Error())
		return nil
	}
	return err
}
