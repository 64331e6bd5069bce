package main

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseProcStatCommWithSpacesAndParens(t *testing.T) {
	line := "4242 (postgres: a) b) S 17 4242 4242 0 -1 4194560 100 0 0 0 31 7 5 3 20 0 1 0 100 1000 10\n"
	comm, f, ok := parseProcStat(line)
	if !ok || comm != "postgres: a) b" {
		t.Fatalf("comm %q, ok %v", comm, ok)
	}
	if f[0] != "S" || f[1] != "17" || f[11] != "31" || f[12] != "7" || f[13] != "5" || f[14] != "3" {
		t.Fatalf("fields %q: want state S, ppid 17, utime 31, stime 7, cutime 5, cstime 3", f)
	}
	if _, _, ok := parseProcStat("4242 (short) S 1 2"); ok {
		t.Fatal("a line with too few fields parsed")
	}
}

// A backend that ends between two readings moves from its own line into its
// postmaster's reaped time: the difference of the two sums counts the CPU
// it used in between once, and a backend born and ended in between fully.
func TestSumPostgresCountsAnEndedBackendOnce(t *testing.T) {
	before := map[int]pgProc{
		100: {ppid: 1, ticks: 50, reaped: 20}, // postmaster
		101: {ppid: 100, ticks: 10},           // checkpointer
		200: {ppid: 100, ticks: 7},            // backend, ends at 9
	}
	after := map[int]pgProc{
		100: {ppid: 1, ticks: 51, reaped: 20 + 9 + 4}, // + the backend, + one born and ended (4)
		101: {ppid: 100, ticks: 12},
		300: {ppid: 100, ticks: 5}, // a new backend
	}
	got := sumPostgres(after) - sumPostgres(before)
	if want := 1.0 + 2 + (9 - 7) + 4 + 5; got != want {
		t.Fatalf("server CPU between the readings: %v ticks, want %v", got, want)
	}
}

// TestCPUBudgetIsWhatTheCoresLeave: at 0.8 of a direct rate of 250k
// rows/s two busy cores give 1.0 CPU-s per 100k records; PostgreSQL's 0.5
// and the broker's 0.05 in the pipeline's run leave 0.45.
func TestCPUBudgetIsWhatTheCoresLeave(t *testing.T) {
	direct := pgRun{drainResult: drainResult{Events: 250_000, Steady: time.Second}}
	pipeline := pgRun{drainResult: drainResult{Events: 200_000, Steady: time.Second, CPU: cpuUse{broker: 0.1}}, pgCPU: 1.0}
	if got := cpuBudget(2, pipeline, direct); math.Abs(got-0.45) > 1e-9 {
		t.Fatalf("budget %.4f, want 0.45", got)
	}
	if got := cpuBudget(2, pipeline, pgRun{}); got != 0 {
		t.Fatalf("budget without a direct rate %.4f, want 0", got)
	}
}

// TestBudgetRowsOfUpsertsAndRollups: unpinned, the section reports for
// each format the budget of its upsert against the direct loop and of its
// rollup against the Poll loop, the latter beside the Poll loop's own CPU
// and what is left past it.
func TestBudgetRowsOfUpsertsAndRollups(t *testing.T) {
	run := func(rate, cores, pgCPU float64) pgRun {
		steady := time.Duration(float64(time.Second) * 400_000 / rate)
		return pgRun{drainResult: drainResult{Events: 400_000, Steady: steady, CPU: cpuUse{self: cores}}, pgCPU: pgCPU}
	}
	round := pgRateRound{upsert: map[string]pgRatePair{}, rollup: map[string]pgRatePair{}}
	for _, f := range pgRateUpsertFormats {
		round.upsert[f] = pgRatePair{ratchet: run(120_000, 0.7, 3), base: run(150_000, 0.3, 3.6)}
	}
	for _, f := range pgRateRollupFormats {
		round.rollup[f] = pgRatePair{ratchet: run(300_000, 1.2, 0.4), base: run(500_000, 1.25, 0)}
	}
	s := &pgRateReport{records: 400_000, rounds: []pgRateRound{round}}
	var rows [][]string
	s.rows(func(cells ...string) { rows = append(rows, cells) })
	rollup := round.rollup["avro"]
	budget := cpuBudget(runtime.NumCPU(), rollup.ratchet, rollup.base)
	poll := rollup.base.ratchetPer100k()
	want := fmt.Sprintf("%.2f (rounds: %.2f); the bare Poll loop itself %.2f, leaving %.2f for everything past reading and decoding two fields; ratchet %.2f",
		budget, budget, poll, budget-poll, rollup.ratchet.ratchetPer100k())
	var upserts, rollups int
	for _, r := range rows {
		switch {
		case strings.Contains(r[0], "upsert pipeline may take"):
			upserts++
		case strings.Contains(r[0], "Avro rollup pipeline may take"):
			rollups++
			if r[1] != want {
				t.Fatalf("Avro rollup budget row:\n%s\nwant\n%s", r[1], want)
			}
		case strings.Contains(r[0], "rollup pipeline may take"):
			rollups++
		}
	}
	if upserts != len(pgRateRollupFormats) || rollups != len(pgRateRollupFormats) {
		t.Fatalf("%d upsert and %d rollup budget rows, want %d of each", upserts, rollups, len(pgRateRollupFormats))
	}
}
