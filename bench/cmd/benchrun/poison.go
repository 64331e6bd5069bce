package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"ratchet/config"
	"ratchet/engine"
)

// poisonReport is the poison section (j3): the JSON upsert pipeline's
// drain of orders of which 1 % are refused by ratchet itself (a conversion,
// a missing field, a bool where a number is read: known before any
// statement is sent), against the drain of the same orders all clean,
// with the refused records taken out of their batches and, for reference,
// isolated by splitting their batches (the path before).
type poisonReport struct {
	orders, poison int64
	rounds         []poisonRound
}

type poisonRound struct {
	clean, taken, split drainResult
}

// Topics of the section, created with the broker.
var poisonTopics = []string{"orders-clean", "orders-clean.dlq", "orders-poison", "orders-poison.dlq"}

const poisonTable = "bench_orders_poison"

// poisoned says whether order i of the poisoned topic is refused: one in
// 101, so that every key (i mod 10,000) also has clean orders.
func poisoned(i int64) bool { return i%101 == 50 }

// poisonOrder encodes order i of the poisoned topic: a poisoned one is
// refused by the order pipeline, in turn for an amount double() cannot
// read, a customer without an id, and an amount that is a bool.
func poisonOrder(i int64, o benchOrder) ([]byte, error) {
	if !poisoned(i) {
		return json.Marshal(o)
	}
	switch (i / 101) % 3 {
	case 0:
		return fmt.Appendf(nil, `{"status": %q, "amount": "a lot", "customer": {"id": %q, "country": %q}}`, o.Status, o.Customer.ID, o.Customer.Country), nil
	case 1:
		return fmt.Appendf(nil, `{"status": %q, "amount": %v, "customer": {"country": %q}}`, o.Status, o.Amount, o.Customer.Country), nil
	}
	return fmt.Appendf(nil, `{"status": %q, "amount": true, "customer": {"id": %q, "country": %q}}`, o.Status, o.Customer.ID, o.Customer.Country), nil
}

// runPoison measures the section on m orders per topic: rounds of three
// drains (fresh groups, exactly-once), the clean topic, the poisoned one
// with refused records taken out, the poisoned one with them split out,
// the order rotating between rounds; every drain's table and dead-letter
// count are checked.
func runPoison(ctx context.Context, env *benchEnv, m int64, rounds int, profile bool, say func(string, ...any)) (*poisonReport, error) {
	var poison int64
	keys := map[int64]bool{} // the keys with a clean order: the poisoned drains' rows
	for i := range m {
		if poisoned(i) {
			poison++
		} else {
			keys[i%10_000] = true
		}
	}
	start := time.Now()
	if err := preloadOrders(ctx, env.brokers, "orders-clean", m, func(o benchOrder) ([]byte, error) { return json.Marshal(o) }); err != nil {
		return nil, fmt.Errorf("preload orders-clean: %w", err)
	}
	if err := preloadOrdersAt(ctx, env.brokers, "orders-poison", m, poisonOrder); err != nil {
		return nil, fmt.Errorf("preload orders-poison: %w", err)
	}
	say("preloaded %d json orders to orders-clean and to orders-poison (%d refused by the pipeline) in %s", m, poison, time.Since(start).Round(time.Millisecond))
	if _, err := env.db.pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+poisonTable+
		" (order_id text PRIMARY KEY, customer text, amount double precision, updated_at timestamptz)"); err != nil {
		return nil, err
	}
	kinds := []string{"clean", "taken out", "split"}
	drain := func(r, kind int) (drainResult, error) {
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE "+poisonTable); err != nil {
			return drainResult{}, err
		}
		if err := env.checkpoint(ctx); err != nil {
			return drainResult{}, err
		}
		topic, want, wantRows, wait := "orders-poison", m-poison, int64(len(keys)), time.Duration(0)
		switch kind {
		case 0:
			topic, want, wantRows = "orders-clean", m, min(m, 10_000)
		case 2:
			wait = -1
		}
		group := fmt.Sprintf("bench-j3-%s-%d", strings.ReplaceAll(kinds[kind], " ", "-"), r)
		e, d, err := drainRatchetOpts(ctx, env, topic, group, want, func(o *engine.Options) { o.RejectWait = wait },
			func(c *config.Config) { c.Pipelines = orderPipeline(topic, "json", poisonTable) })
		if err != nil {
			return drainResult{}, fmt.Errorf("round %d (j3) %s: %w", r, kinds[kind], err)
		}
		d.Events = m // the rate counts every record read, applied or refused
		var rows int64
		if err := env.db.pool.QueryRow(ctx, "SELECT count(*) FROM "+poisonTable).Scan(&rows); err != nil || rows != wantRows {
			return drainResult{}, fmt.Errorf("round %d (j3) %s: %d rows in %s, want %d (%v)", r, kinds[kind], rows, poisonTable, wantRows, err)
		}
		if dead := int64(e.dead); kind > 0 && dead < poison {
			return drainResult{}, fmt.Errorf("round %d (j3) %s: %d dead letters, want %d", r, kinds[kind], dead, poison)
		}
		say("round %d (j3) exactly-once JSON upsert, %-10s %9.0f records/s (wall %s), %.0f rejected, %.0f bisections, %s",
			r, kinds[kind]+":", d.Rate(), d.Wall.Round(time.Millisecond), e.rejected, e.bisections, d.cpuLine())
		return d, nil
	}
	rep := &poisonReport{orders: m, poison: poison}
	for r := 1; r <= rounds; r++ {
		var x poisonRound
		out := []*drainResult{&x.clean, &x.taken, &x.split}
		for k := range 3 {
			kind := (k + r - 1) % 3
			d, err := drain(r, kind)
			if err != nil {
				return nil, err
			}
			*out[kind] = d
		}
		rep.rounds = append(rep.rounds, x)
	}
	if profile {
		// One more clean and one more taken-out drain, each under a CPU
		// profile and between two allocs profiles (-profile).
		for _, kind := range []int{0, 1} {
			path := env.outPath("cpu-poison-" + strings.ReplaceAll(kinds[kind], " ", "-") + ".pprof")
			if err := profiled(path, func() error { _, err := drain(rounds+1, kind); return err }); err != nil {
				return nil, err
			}
			say("profile: %s", path)
		}
	}
	return rep, nil
}

// drainCounts are what an engine's counters said at the end of a drain.
type drainCounts struct{ dead, rejected, bisections float64 }

// drainRatchetOpts is drainRatchet (exactly-once, the pipelines' own
// processor, no profile) with engine options, also returning the drain's
// dead-letter, rejection and bisection counts.
func drainRatchetOpts(ctx context.Context, env *benchEnv, topic, group string, n int64, opts func(*engine.Options), tweaks ...func(*config.Config)) (drainCounts, drainResult, error) {
	cfg := env.config(env.brokers, topic, group, config.ModeExactlyOnce)
	for _, t := range tweaks {
		t(&cfg)
	}
	e := startEngineWith(ctx, cfg, nil, env.engineLog, opts)
	first, last, cpu, err := e.waitRecords(ctx, n, 10*time.Minute, env.brokerPID)
	busy := e.histogramSum("ratchet_batch_duration_seconds")
	counts := drainCounts{dead: e.counter("ratchet_dead_letters_total"), rejected: e.counter("ratchet_rejected_records_total"),
		bisections: e.counter("ratchet_bisections_total")}
	if serr := e.stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return counts, drainResult{}, err
	}
	return counts, drainResult{Events: n, Wall: last.Sub(e.start), Steady: last.Sub(first), TxBusy: busy, CPU: cpu}, nil
}

// rows adds the section's rows to the results table.
func (s *poisonReport) rows(row func(cells ...string)) {
	if s == nil || len(s.rounds) == 0 {
		return
	}
	series := func(f func(poisonRound) float64, format string) (string, float64) {
		var xs []float64
		var parts []string
		for _, r := range s.rounds {
			xs = append(xs, f(r))
			parts = append(parts, fmt.Sprintf(format, f(r)))
		}
		return strings.Join(parts, ", "), median(xs)
	}
	for _, k := range []struct {
		name string
		d    func(poisonRound) drainResult
	}{
		{fmt.Sprintf("(j3) exactly-once JSON upsert, %d clean orders", s.orders), func(r poisonRound) drainResult { return r.clean }},
		{fmt.Sprintf("(j3) the same with %d (1 %%) refused by ratchet, taken out of their batches", s.poison), func(r poisonRound) drainResult { return r.taken }},
		{"(j3) the same, refused records isolated by splitting their batches (the path before)", func(r poisonRound) drainResult { return r.split }},
	} {
		rs, v := series(func(r poisonRound) float64 { return k.d(r).Rate() }, "%.0f")
		cs, c := series(func(r poisonRound) float64 { return selfPer100k(k.d(r)) }, "%.2f")
		row(k.name, fmt.Sprintf("%.0f records/s (rounds: %s); ratchet's process %.2f CPU-s per 100,000 records (rounds: %s)", v, rs, c, cs), "", "")
	}
	rs, v := series(func(r poisonRound) float64 { return r.taken.Rate() / r.clean.Rate() }, "%.2f")
	row("(j3) 1 % poison taken out / clean", fmt.Sprintf("%.2f (rounds: %s)", v, rs), "≥ 0.9", passMiss(v >= 0.9))
	rs, v = series(func(r poisonRound) float64 { return r.split.Rate() / r.clean.Rate() }, "%.2f")
	row("(j3) 1 % poison split / clean (reference)", fmt.Sprintf("%.2f (rounds: %s)", v, rs), "", "")
}

// selfPer100k is the CPU time of the bench's own process (the engine runs
// in it), in seconds, that 100,000 records took: on shared cores the
// machine's figure counts the neighbours too.
func selfPer100k(d drainResult) float64 {
	if d.Events <= 0 {
		return 0
	}
	return d.CPU.self * d.Steady.Seconds() / float64(d.Events) * 1e5
}

// method says how the section is measured.
func (s *poisonReport) method() string {
	if s == nil || len(s.rounds) == 0 {
		return ""
	}
	return fmt.Sprintf("- Poison (j3): %d rounds, each three exactly-once drains (fresh groups) by the JSON order upsert pipeline (j) into `%s`: the %d orders of `orders-clean`, and the same orders in `orders-poison` where one in 101 (%d) is refused by the pipeline before any statement is sent (an amount `double()` cannot read, a customer without an id, an amount that is a bool), once taken out of their batches and once isolated by splitting the batches (`engine.Options.RejectWait` < 0, the path before); the order rotates between rounds, the table and the dead letters are checked after each, records/s counts every record read (applied or dead-lettered) from the first to the last, CPU is the bench process's own (the engine runs in it; the machine's cores are shared), and the median is reported. Before each drain a `CHECKPOINT` writes out what earlier runs left dirty.\n",
		len(s.rounds), poisonTable, s.orders, s.poison)
}
