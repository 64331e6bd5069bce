package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/internal/gcpolicy"
)

// round is one interleaved set of drains.
type round struct {
	a, b, c, d drainResult
	a2         drainResult // (a) decoding every record
	e          drainResult // (c) on a backlog with 1 % poison
	f          drainResult // (c) with postgres.synchronous_commit off
	steal      float64     // % of CPU time stolen by other guests during the round
}

// report collects every figure of a run.
type report struct {
	opts       options
	began      time.Time
	elapsed    time.Duration
	machine    []string
	pgVersion  string
	preload    []string
	brokerRSS  float64
	rounds     []round
	poison     int64 // poison records in the (e) backlog, each found in ratchet_dead_letters
	profiles   []string
	pgStates   pgStates // the engine's connections during the profiled (c) drain
	latency    latencyResult
	memSmall   memResult
	memLarge   memResult
	commits    []commitResult
	rewindRate float64
	rewinds    []rewindResult
	scale      *scaleReport     // the partition-count section (issue 18)
	execMode   *execModeReport  // the query exec mode section (issue 27)
	tracing    *tracingReport   // the tracing section (issue 26)
	pipelines  *pipelinesReport // the configured-pipelines section (issue 25)
	appendSink *appendReport    // the append section (j2)
	// appendSinkPinned is section (j2) again with PostgreSQL pinned to CPU 0.
	appendSinkPinned *appendReport
	poisoned         *poisonReport // the poison section (j3)
	kill             *killReport   // the restart-after-kill -9 section (issue 32)
	pgRate           *pgRateReport // the PostgreSQL-rate section (l, issue 33)
	// pgRatePinned is section (l) again with PostgreSQL pinned to CPU 0.
	pgRatePinned *pgRateReport
}

type medians struct{ a, b, c, d float64 }

func (r *report) medians() medians {
	var a, b, c, d []float64
	for _, x := range r.rounds {
		a, b, c, d = append(a, x.a.Rate()), append(b, x.b.Rate()), append(c, x.c.Rate()), append(d, x.d.Rate())
	}
	return medians{median(a), median(b), median(c), median(d)}
}

// ratios returns the per-round ratios num/den, and their median.
func (r *report) ratios(num, den func(round) float64) (string, float64) {
	var xs []float64
	var parts []string
	for _, x := range r.rounds {
		v := num(x) / den(x)
		xs = append(xs, v)
		parts = append(parts, fmt.Sprintf("%.2f", v))
	}
	return strings.Join(parts, ", "), median(xs)
}

func passMiss(ok bool) string {
	if ok {
		return "pass"
	}
	return "**miss**"
}

func (r *report) table() string {
	var sb strings.Builder
	row := func(cells ...string) { sb.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
	row("measure", "measured", "target", "result")
	row("---", "---", "---", "---")
	if r.opts.onlyScale {
		r.scale.rows(row)
		return sb.String()
	}
	if r.opts.onlyExecMode {
		r.execMode.rows(row)
		return sb.String()
	}
	if r.opts.onlyTracing {
		r.tracing.rows(row)
		return sb.String()
	}
	if r.opts.onlyPipelines {
		r.pipelines.rows(row)
		return sb.String()
	}
	if r.opts.onlyAppend {
		r.appendSink.rows(row)
		r.appendSinkPinned.rows(row)
		return sb.String()
	}
	if r.opts.onlyPoison {
		r.poisoned.rows(row)
		return sb.String()
	}
	if r.opts.onlyKill {
		r.kill.rows(row)
		return sb.String()
	}
	if r.opts.onlyPGRate {
		r.pgRate.rows(row)
		r.pgRatePinned.rows(row)
		return sb.String()
	}
	m := r.medians()
	perRound := func(f func(round) float64) string {
		var s []string
		for _, x := range r.rounds {
			s = append(s, fmt.Sprintf("%.0f", f(x)))
		}
		return strings.Join(s, ", ")
	}
	ra := func(x round) float64 { return x.a.Rate() }
	rb := func(x round) float64 { return x.b.Rate() }
	rc := func(x round) float64 { return x.c.Rate() }
	rd := func(x round) float64 { return x.d.Rate() }
	row("(a) consumer ceiling, bare Poll loop", fmt.Sprintf("%.0f events/s (rounds: %s)", m.a, perRound(ra)), "baseline", "")
	ra2 := func(x round) float64 { return x.a2.Rate() }
	hasA2 := len(r.rounds) > 0 && r.rounds[0].a2.Events > 0
	if hasA2 {
		row("(a′) the same loop decoding every record with ratchet's decoder", fmt.Sprintf("%.0f events/s (rounds: %s)", median(collect(r.rounds, ra2)), perRound(ra2)), "", "")
	}
	row("(b) ratchet at-least-once, no-op", fmt.Sprintf("%.0f events/s (rounds: %s)", m.b, perRound(rb)), "", "")
	row("(c) ratchet exactly-once, dashboard", fmt.Sprintf("%.0f events/s (rounds: %s)", m.c, perRound(rc)), "", "")
	row("(d) naive loop, upsert per record, auto commit", fmt.Sprintf("%.0f events/s (rounds: %s)", m.d, perRound(rd)), "", "")
	inTx := func(f func(round) drainResult) string {
		var s []string
		for _, x := range r.rounds {
			s = append(s, fmt.Sprintf("%.1f", f(x).inTx()))
		}
		return strings.Join(s, ", ")
	}
	row("partitions inside a batch transaction on average, (b) / (c), per round (of 12)",
		inTx(func(x round) drainResult { return x.b })+" / "+inTx(func(x round) drainResult { return x.c }), "", "")
	if len(r.rounds) > 0 && r.rounds[0].steal >= 0 {
		var st []string
		for _, x := range r.rounds {
			st = append(st, fmt.Sprintf("%.0f %%", x.steal))
		}
		row("CPU steal during each round (time the hypervisor gave to other guests)", strings.Join(st, ", "), "", "")
	}
	s, v := r.ratios(rb, ra)
	row("(b) / (a)", fmt.Sprintf("%.2f (rounds: %s)", v, s), "≥ 0.9", passMiss(v >= 0.9))
	if hasA2 {
		s, v = r.ratios(ra2, ra)
		row("(a′) / (a): what decoding alone leaves of the ceiling", fmt.Sprintf("%.2f (rounds: %s)", v, s), "", "")
		s, v = r.ratios(rb, ra2)
		row("(b) / (a′): the engine against a loop that decodes", fmt.Sprintf("%.2f (rounds: %s)", v, s), "", "")
	}
	s, v = r.ratios(rc, ra)
	row("(c) / (a)", fmt.Sprintf("%.2f (rounds: %s)", v, s), "≥ 0.7", passMiss(v >= 0.7))
	s, v = r.ratios(rc, rd)
	row("(c) / (d)", fmt.Sprintf("%.0f (rounds: %s)", v, s), "≥ 100", passMiss(v >= 100))
	rates := func(f func(round) float64) string { // median and rounds
		return fmt.Sprintf("%.0f events/s (rounds: %s)", median(collect(r.rounds, f)), perRound(f))
	}
	if len(r.rounds) > 0 && r.rounds[0].e.Events > 0 {
		re := func(x round) float64 { return x.e.Rate() }
		row(fmt.Sprintf("(e) ratchet exactly-once, dashboard, %d events with 1 %% poison (%d dead-lettered)", r.rounds[0].e.Events, r.poison),
			rates(re), "", "")
		s, v = r.ratios(re, rc)
		row("(e) / (c): poison run against the clean run", fmt.Sprintf("%.2f (rounds: %s)", v, s), "≥ 0.8", passMiss(v >= 0.8))
	}
	if len(r.rounds) > 0 && r.rounds[0].f.Events > 0 {
		rf := func(x round) float64 { return x.f.Rate() }
		row("(f) as (c) with `postgres.synchronous_commit: off` (opt-in)", rates(rf), "", "")
		s, v = r.ratios(rf, ra)
		row("(f) / (a)", fmt.Sprintf("%.2f (rounds: %s)", v, s), "(for comparison with (c) / (a))", "")
	}
	l := r.latency
	row(fmt.Sprintf("latency p50 at %.0f events/s, produce → committed", l.Rate), ms(l.P50), "", "")
	row(fmt.Sprintf("latency p99 at %.0f events/s", l.Rate), ms(l.P99), "≤ 100 ms", passMiss(l.P99 <= 100*time.Millisecond))
	row(fmt.Sprintf("latency max at %.0f events/s", l.Rate), ms(l.Max), "", "")
	row("latency p50 / p99, engine histogram (record timestamp → commit)", ms(l.HistP50)+" / "+ms(l.HistP99), "", "")
	row(fmt.Sprintf("peak RSS, `ratchet run`, %d backlog", r.memSmall.Events), fmt.Sprintf("%.1f MiB", r.memSmall.PeakMiB), "≤ 200 MiB", passMiss(r.memSmall.PeakMiB <= 200))
	row(fmt.Sprintf("peak RSS, `ratchet run`, %d backlog", r.memLarge.Events), fmt.Sprintf("%.1f MiB", r.memLarge.PeakMiB), "≤ 200 MiB", passMiss(r.memLarge.PeakMiB <= 200))
	mr := r.memLarge.PeakMiB / r.memSmall.PeakMiB
	row(fmt.Sprintf("RSS %d / RSS %d", r.memLarge.Events, r.memSmall.Events), fmt.Sprintf("%.2f", mr), "≤ 1.3", passMiss(mr <= 1.3))
	r.scale.rows(row)
	r.execMode.rows(row)
	r.tracing.rows(row)
	r.pipelines.rows(row)
	r.appendSink.rows(row)
	r.appendSinkPinned.rows(row)
	r.pgRate.rows(row)
	r.pgRatePinned.rows(row)
	r.poisoned.rows(row)
	r.kill.rows(row)
	for _, c := range r.commits {
		row(fmt.Sprintf("OffsetCommit requests/s at %.0f events/s (applied %.0f/s)", c.TargetRate, c.AchievedRate),
			fmt.Sprintf("%.2f (%d in %s)", c.PerSecond(), c.Commits, c.Window.Round(time.Millisecond)),
			"≤ 1 (commit.interval 1s, 1 instance)", passMiss(c.PerSecond() <= 1.0))
	}
	for _, w := range r.rewinds {
		target, ok := "", true
		if w.Name == "ratchet" {
			target, ok = "0 replayed, 0 lost", w.Replayed() == 0 && w.Lost() == 0
		}
		res := ""
		if target != "" {
			res = passMiss(ok)
		}
		row(fmt.Sprintf("%d SIGTERM/restart cycles: %s", w.Cycles, rewindLabel(w.Name)),
			fmt.Sprintf("%d replayed, %d lost (of %d)", w.Replayed(), w.Lost(), w.Produced), target, res)
	}
	return sb.String()
}

// collect is f of every round.
func collect(rounds []round, f func(round) float64) []float64 {
	xs := make([]float64, 0, len(rounds))
	for _, x := range rounds {
		xs = append(xs, f(x))
	}
	return xs
}

// cpuTable says, for each drain, how busy the machine was from its first
// record to its last and where the CPU went (medians of the rounds).
func (r *report) cpuTable() string {
	if len(r.rounds) == 0 || r.rounds[0].a.CPU.machine <= 0 {
		return ""
	}
	var sb strings.Builder
	row := func(cells ...string) { sb.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
	row("drain", "machine busy (cores)", "the process under test", "broker", "the rest (PostgreSQL …)", "machine CPU-seconds per 1,000,000 events")
	row("---", "---", "---", "---", "---", "---")
	for _, d := range []struct {
		name string
		f    func(round) drainResult
	}{
		{"(a) ceiling", func(x round) drainResult { return x.a }},
		{"(a′) ceiling + decode", func(x round) drainResult { return x.a2 }},
		{"(b) at-least-once, no-op", func(x round) drainResult { return x.b }},
		{"(c) exactly-once, dashboard", func(x round) drainResult { return x.c }},
		{"(f) (c), synchronous_commit off", func(x round) drainResult { return x.f }},
		{"(e) (c), 1 % poison", func(x round) drainResult { return x.e }},
	} {
		if d.f(r.rounds[0]).Events == 0 {
			continue
		}
		med := func(g func(drainResult) float64) string {
			return fmt.Sprintf("%.2f", median(collect(r.rounds, func(x round) float64 { return g(d.f(x)) })))
		}
		row(d.name, med(func(x drainResult) float64 { return x.CPU.machine }), med(func(x drainResult) float64 { return x.CPU.self }),
			med(func(x drainResult) float64 { return x.CPU.broker }), med(func(x drainResult) float64 { return x.CPU.rest() }),
			med(drainResult.cpuPerMillion))
	}
	return sb.String()
}

func rewindLabel(name string) string {
	switch name {
	case "naive":
		return "naive loop, no signal handling (SIGTERM kills it)"
	case "naive-commit":
		return "naive loop, `Commit()` then `Close()` on SIGTERM"
	default:
		return "ratchet exactly-once (graceful stop)"
	}
}

func (r *report) markdown(table string) string {
	var sb strings.Builder
	o := r.opts
	fmt.Fprintf(&sb, "# Benchmark results\n\n")
	fmt.Fprintf(&sb, "Written by `make bench` (`bench/cmd/benchrun`) on %s; the run took %s.\n\n", r.began.UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second))
	fmt.Fprintf(&sb, "Command: `%s`\n\n", o.command)
	sb.WriteString("## Machine and versions\n\n")
	for _, l := range r.machine {
		fmt.Fprintf(&sb, "- %s\n", l)
	}
	fmt.Fprintf(&sb, "- PostgreSQL: %s (local, 127.0.0.1:5432; a fresh database per run, dropped after)\n", r.pgVersion)
	sb.WriteString("- The machine is shared with other test runs, so every comparison is made inside one run, interleaved, median of the rounds.\n")
	fmt.Fprintf(&sb, "- Go collector: this process (the in-process engines and the baselines beside them) runs at GOGC=%d, the growth ratio `ratchet run` sets under its soft memory limit (package `internal/gcpolicy`), without that limit; the `ratchet run` subprocesses of the memory rows run with both, as a user's would.\n\n", gcpolicy.GOGC())
	sb.WriteString("## Results\n\n")
	sb.WriteString(table)
	if t := r.cpuTable(); t != "" {
		fmt.Fprintf(&sb, "\n### CPU while draining (of %d), medians of the rounds\n\n", runtime.NumCPU())
		sb.WriteString(t)
	}
	sb.WriteString("\n## How each figure is measured\n\n")
	fmt.Fprintf(&sb, "- Broker: `ratchet broker` (kfake, in memory) as a separate process, 12 partitions per topic. Backlogs, produced with the in-process `internal/produce` producer (rate 0, lz4): %s. Broker RSS after the preload: %.0f MiB.\n",
		strings.Join(r.preload, "; "), r.brokerRSS)
	fmt.Fprintf(&sb, "- Drains: %d rounds, each (a), (a′), (b), (c), (f), (e), (d) in that order, each with a fresh consumer group on the same %d-event backlog. Rate = events / (time of the last record − time of the first record), so group join time is left out (wall times are in `bench/out/bench.log`).\n", o.rounds, o.events)
	sb.WriteString("  - (a): confluent-kafka-go `Poll(100)` loop with `kafkaclient.ConsumerConfig` (auto commit and offset store off, cooperative-sticky, ratchet's fetch settings), counting messages, decoding nothing.\n")
	sb.WriteString("  - (a′): (a) with every record's value decoded by `event.Decoder` (protobuf), the decoding (b) does too; informational, to separate the cost of checking the input from the engine's own.\n")
	sb.WriteString("  - (b): `engine.Run` in-process, `commit.mode=at-least-once`, a `processor.Func` that returns nil, other settings default; done when `ratchet_records_total` (polled every 5 ms: by gathering the engine's registry until the family has a series, then from the engine's own collector of it alone, so that watching the drain costs the engine no more than counting costs the Poll loops) reaches the backlog.\n")
	sb.WriteString("  - (c): `engine.Run` in-process, defaults (exactly-once, dashboard processor, batch_size 500, linger 20ms); same completion check, then `sum(count)` of `dashboard_rollups` is checked to equal the backlog. \"Partitions inside a batch transaction\" is the sum of `ratchet_batch_duration_seconds` over the drain's duration: near 12, the partitions wait on PostgreSQL (in (c), on the row locks of the current minute, which every partition's transaction updates); near 0, on their input. (b)'s no-op batches write nothing and take no connection, so its figure is near 0 by construction.\n")
	sb.WriteString("  - (f): as (c) with `postgres.synchronous_commit: off`, an opt-in setting (transactions commit without waiting for the WAL flush; see the README's Guarantees), not the default.\n")
	sb.WriteString("  - (e): as (c) on a backlog of the same size with 1 % poison records; its rate counts every record read, poison included, and the DLQ rows in `ratchet_dead_letters` are checked to equal the poison count.\n")
	sb.WriteString("  - CPU: sampled when a drain's first record is seen and when its last is: the machine's busy time from the first line of `/proc/stat` (idle, I/O wait and steal left out), and user + system time of this process (the Poll loop or the in-process engine, librdkafka's threads included) and of the broker from `/proc/<pid>/stat`; \"the rest\" is the difference, PostgreSQL's server processes above all.\n")
	fmt.Fprintf(&sb, "  - (d): `Poll`, `proto.Unmarshal`, one `INSERT ... ON CONFLICT DO UPDATE` per record on one connection (autocommit, i.e. one transaction each), librdkafka defaults (`enable.auto.commit=true`); run for %s from its first record.\n", o.naiveFor)
	fmt.Fprintf(&sb, "- Latency: in-process engine at its defaults (exactly-once, dashboard) on topic `lat`; a paced producer (linger 5 ms) writes %.0f events/s for %s. For each record: time from its `Produce` call to the first moment `ratchet_offsets.next_offset` of its partition was seen past it (PostgreSQL polled every 5 ms from outside the engine, so up to 5 ms high). The first 2 s are left out as warm-up; %d records counted. The engine's own `ratchet_end_to_end_latency_seconds` histogram is given too (quantiles interpolated inside its power-of-two buckets).\n",
		o.latRate, o.latFor, r.latency.Events)
	sb.WriteString("- Memory: `ratchet run` as a subprocess (defaults, configured by `RATCHET_*` variables), draining its own topic; `VmHWM` of `/proc/<pid>/status` read when the stored offsets reached the backlog, then SIGTERM.\n")
	sb.WriteString(r.scale.method())
	sb.WriteString(r.execMode.method())
	sb.WriteString(r.tracing.method())
	sb.WriteString(r.pipelines.method())
	sb.WriteString(r.appendSink.method())
	sb.WriteString(r.appendSinkPinned.method())
	sb.WriteString(r.pgRate.method())
	sb.WriteString(r.pgRatePinned.method())
	sb.WriteString(r.poisoned.method())
	sb.WriteString(r.kill.method())
	sb.WriteString("- Commit load: the broker is a separate process whose requests cannot be counted without changing `cmd/` or `internal/`, so this part alone runs an **in-process kfake** (`kfake.NewCluster` with `ControlKey(OffsetCommit)` + `KeepControl`, counting and passing every request through) and the engine in-process at its defaults (`commit.interval=1s`), fed by `internal/produce` at the given rate; requests counted over 10 s after 5 s of warm-up.\n")
	fmt.Fprintf(&sb, "- Restart cycles: a producer writes %.0f events/s to the contestant's own topic; the contestant (a subprocess) runs %s, gets SIGTERM, is waited for and started again, %d times; then the producer stops and one last instance catches up. Every applied event appends its id to a ledger table (no unique constraint; the naive loop one autocommit INSERT per record, ratchet inside the batch transaction): replayed = rows − distinct ids, lost = produced − distinct ids. The naive loops use static membership (`group.instance.id`) so a restart does not wait for the session timeout; ratchet uses `kafka.instance_id`.\n",
		r.rewindRate, o.cycleRun, o.cycles)
	if len(r.profiles) > 0 {
		sb.WriteString("\n## Profiles\n\nCPU profiles (`runtime/pprof`) of one extra drain of the in-process engine, taken because a throughput target was missed (or `-profile`). Files in `bench/out/`.\n\n")
		if r.pgStates.samples > 0 {
			fmt.Fprintf(&sb, "What the engine's PostgreSQL connections were doing during the profiled (c) drain (`pg_stat_activity` every 5 ms, %d samples; connections in each state on average, of the pool's 16 (the default: 12 partitions + 4)): %s.\n\n",
				r.pgStates.samples, r.pgStates)
		}
		for _, p := range r.profiles {
			sb.WriteString(p)
			sb.WriteString("\n")
		}
	}
	return sb.String()
}

func machineInfo() []string {
	var out []string
	out = append(out, fmt.Sprintf("CPUs: %d (nproc)", runtime.NumCPU()))
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				out = append(out, "CPU model: "+strings.TrimSpace(strings.SplitN(l, ":", 2)[1]))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal") {
				var kb int64
				fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "MemTotal:")), "%d", &kb)
				out = append(out, fmt.Sprintf("Memory: %.1f GiB", float64(kb)/1024/1024))
			}
		}
	}
	if b, err := exec.Command("uname", "-sr").Output(); err == nil {
		out = append(out, "Kernel: "+strings.TrimSpace(string(b)))
	}
	out = append(out, "Go: "+runtime.Version())
	_, lv := kafka.LibraryVersion()
	out = append(out, "librdkafka: "+lv+" (bundled with confluent-kafka-go v2.11.1)")
	return out
}

func pgVersion(ctx context.Context, db *database) string {
	var v string
	if err := db.pool.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "unknown"
	}
	return v
}

// profileTop renders the top of a CPU profile with `go tool pprof`.
func profileTop(title, path string) string {
	self, _ := os.Executable()
	var parts []string
	for _, mode := range [][]string{{"-top", "-nodecount=25"}, {"-top", "-cum", "-nodecount=25"}} {
		args := append([]string{"tool", "pprof"}, mode...)
		args = append(args, self, path)
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			parts = append(parts, fmt.Sprintf("(go tool pprof failed: %v)\n%s", err, out))
			continue
		}
		parts = append(parts, string(out))
	}
	return fmt.Sprintf("### %s\n\n```\n%s```\n\n```\n%s```\n", title, parts[0], parts[1])
}
