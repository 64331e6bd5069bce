package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/store"
)

// appendReport is the append section (j2): an append pipeline's drain of
// the JSON orders against a direct pgx CopyFrom loop writing the same rows
// with the same connections and rows per transaction.
type appendReport struct {
	orders int64
	rounds []appendRound
	// pinned: PostgreSQL ran on CPU 0 only, the bench process and the
	// broker on the others (pin.go), and no Poll loop ran; skipped says
	// why it could not be.
	pinned  bool
	skipped string
}

type appendRound struct {
	ratchet, direct pgRun
	// poll is a bare Poll loop reading the same records and decoding the
	// two fields a rollup reads, writing nothing: what reading alone
	// costs and allows on this machine.
	poll pgRun
}

const appendTable = "bench_append"

var appendColumns = []string{"part", "off", "order_id", "status", "customer", "amount", "at"}

// appendPipeline appends every order of topic to appendTable.
func appendPipeline(topic string) []config.Pipeline {
	exprs := []string{"record.partition", "record.offset", "string(record.key)", "value.status", "value.customer.id", "value.amount", "record.timestamp"}
	cols := make([]config.Column, len(exprs))
	for i, e := range exprs {
		cols[i] = config.Column{Name: appendColumns[i], Expr: e}
	}
	return []config.Pipeline{{Name: "order_log", Topic: topic, Format: config.PipelineJSON,
		Append: &config.Append{Table: appendTable, Columns: cols}}}
}

// runAppend measures the section on the m JSON orders of orders-json
// (preloaded first unless preloaded): rounds interleaved pairs of a
// ratchet drain (exactly-once, fresh group) and a direct loop, the order
// alternating; the first round's ratchet drain goes first and leaves the
// rows the direct loop then writes in every round. With profile, or when
// the median misses 0.8, one more drain runs under the CPU profiler; the
// second result is its profile's top. pinned runs it all with PostgreSQL
// on CPU 0 and this process and the broker on the others, without the
// Poll loop and the profile.
func runAppend(ctx context.Context, env *benchEnv, m int64, rounds int, preloaded, profile, pinned bool, say func(string, ...any)) (*appendReport, []string, error) {
	const topic = "orders-json"
	if pinned {
		p, err := pinSection(env, "(j2)", say)
		if err != nil {
			return nil, nil, err
		}
		defer p.undo()
	}
	if !preloaded {
		start := time.Now()
		if err := preloadOrders(ctx, env.brokers, topic, m, func(o benchOrder) ([]byte, error) { return json.Marshal(o) }); err != nil {
			return nil, nil, fmt.Errorf("preload %s: %w", topic, err)
		}
		say("preloaded %d json orders to %s in %s", m, topic, time.Since(start).Round(time.Millisecond))
	}
	if _, err := env.db.pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+appendTable+
		" (part integer, off bigint, order_id text, status text, customer text, amount double precision, at timestamptz)"); err != nil {
		return nil, nil, err
	}
	cfg := env.config(env.brokers, topic, "bench-j2", config.ModeExactlyOnce)
	conns := engine.DefaultPoolSize(12) // the engine's pool for the 12 partitions (postgres.max_conns 0)
	perTx := cfg.Processing.BatchSize
	count := func() (int64, error) {
		var n int64
		err := env.db.pool.QueryRow(ctx, "SELECT count(*) FROM "+appendTable).Scan(&n)
		return n, err
	}
	var parts map[int32][][]any // the rows by partition, in offset order
	drain := func(r int, profile string) (pgRun, error) {
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE "+appendTable); err != nil {
			return pgRun{}, err
		}
		if err := env.checkpoint(ctx); err != nil {
			return pgRun{}, err
		}
		pg := measurePG(env)
		d, err := drainRatchet(ctx, env, topic, fmt.Sprintf("bench-j2-append-%d-%d", r, time.Now().UnixNano()), config.ModeExactlyOnce, nil, m, profile,
			func(c *config.Config) { c.Pipelines = appendPipeline(topic) })
		run := pgRun{drainResult: d}
		run.pgCPU, run.pgServer = pg()
		if err != nil {
			return pgRun{}, fmt.Errorf("round %d (j2) append pipeline: %w", r, err)
		}
		if n, err := count(); err != nil || n != m {
			return pgRun{}, fmt.Errorf("round %d (j2) append pipeline: %d rows in %s, want %d (%v)", r, n, appendTable, m, err)
		}
		say("round %d (j2) exactly-once append pipeline: %9.0f records/s (wall %s), %s; CPU-s per 100k: ratchet %.2f, PostgreSQL %.2f (server-wide %.2f)",
			r, run.Rate(), run.Wall.Round(time.Millisecond), run.cpuLine(), run.ratchetPer100k(), run.pgPer100k(), run.pgServerPer100k())
		if parts == nil {
			rows, err := env.db.pool.Query(ctx, "SELECT "+strings.Join(appendColumns, ", ")+" FROM "+appendTable+" ORDER BY part, off")
			if err != nil {
				return pgRun{}, err
			}
			all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([]any, error) { return row.Values() })
			if err != nil {
				return pgRun{}, err
			}
			parts = map[int32][][]any{}
			for _, v := range all {
				p := v[0].(int32)
				parts[p] = append(parts[p], v)
			}
		}
		return run, nil
	}
	direct := func(r int) (pgRun, error) {
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE "+appendTable); err != nil {
			return pgRun{}, err
		}
		if err := env.checkpoint(ctx); err != nil {
			return pgRun{}, err
		}
		pool, err := store.Open(ctx, cfg.Postgres.URL.Reveal(), int32(conns))
		if err != nil {
			return pgRun{}, err
		}
		defer pool.Close()
		pg, cpu0 := measurePG(env), sampleCPU(env.brokerPID)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, len(parts))
		for _, rows := range parts { // one writer per partition, as the engine's
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < len(rows); i += perTx {
					chunk := rows[i:min(i+perTx, len(rows))]
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := tx.CopyFrom(ctx, pgx.Identifier{appendTable}, appendColumns, pgx.CopyFromRows(chunk))
						return err
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		end, cpu := time.Now(), sampleCPU(env.brokerPID).since(cpu0)
		run := pgRun{drainResult: drainResult{Events: m, Wall: end.Sub(start), Steady: end.Sub(start), CPU: cpu}}
		run.pgCPU, run.pgServer = pg()
		close(errs)
		if err := <-errs; err != nil {
			return pgRun{}, fmt.Errorf("round %d (j2) direct CopyFrom: %w", r, err)
		}
		if n, err := count(); err != nil || n != m {
			return pgRun{}, fmt.Errorf("round %d (j2) direct CopyFrom: %d rows in %s, want %d (%v)", r, n, appendTable, m, err)
		}
		say("round %d (j2) direct pgx CopyFrom loop:   %9.0f records/s (wall %s), %s; CPU-s per 100k: loop %.2f, PostgreSQL %.2f (server-wide %.2f)",
			r, run.Rate(), run.Wall.Round(time.Millisecond), run.cpuLine(), run.ratchetPer100k(), run.pgPer100k(), run.pgServerPer100k())
		return run, nil
	}
	rep := &appendReport{orders: m, pinned: pinned}
	for r := 1; r <= rounds; r++ {
		var x appendRound
		var err error
		if r%2 == 1 {
			if x.ratchet, err = drain(r, ""); err == nil {
				x.direct, err = direct(r)
			}
		} else {
			if x.direct, err = direct(r); err == nil {
				x.ratchet, err = drain(r, "")
			}
		}
		if err != nil {
			return nil, nil, err
		}
		if pinned {
			rep.rounds = append(rep.rounds, x)
			continue
		}
		d, err := pollDecode(ctx, env, topic, "json", nil, m)
		if err != nil {
			return nil, nil, fmt.Errorf("round %d (j2) bare Poll loop: %w", r, err)
		}
		x.poll = pgRun{drainResult: d}
		say("round %d (j2) bare Poll loop + json decode: %9.0f records/s (wall %s), %s; CPU-s per 100k: %.2f",
			r, d.Rate(), d.Wall.Round(time.Millisecond), d.cpuLine(), x.poll.ratchetPer100k())
		rep.rounds = append(rep.rounds, x)
	}
	ratio := median(rep.ratios())
	if pinned || !profile && ratio >= 0.8 {
		return rep, nil, nil
	}
	p := env.outPath("cpu-append.pprof")
	if _, err := drain(0, p); err != nil {
		return nil, nil, err
	}
	say("profiled (j2) append pipeline: %s", p)
	return rep, []string{profileTop("(j2) exactly-once append pipeline", p)}, nil
}

// ratios are each round's append pipeline rate over the direct loop's.
func (s *appendReport) ratios() []float64 {
	var xs []float64
	for _, r := range s.rounds {
		xs = append(xs, r.ratchet.Rate()/r.direct.Rate())
	}
	return xs
}

// rows adds the section's rows to the results table.
func (s *appendReport) rows(row func(cells ...string)) {
	if s != nil && s.skipped != "" {
		row("(j2) pinned", "skipped: "+s.skipped, "", "")
		return
	}
	if s == nil || len(s.rounds) == 0 {
		return
	}
	l := "(j2)"
	if s.pinned {
		l = "(j2, PostgreSQL pinned to CPU 0, the rest to the others)"
	}
	series := func(f func(appendRound) float64, format string) (string, float64) {
		var xs []float64
		var parts []string
		for _, r := range s.rounds {
			xs = append(xs, f(r))
			parts = append(parts, fmt.Sprintf(format, f(r)))
		}
		return strings.Join(parts, ", "), median(xs)
	}
	cpu := func(get func(appendRound) pgRun) string {
		rs, v := series(func(r appendRound) float64 { return get(r).ratchetPer100k() }, "%.2f")
		prs, pv := series(func(r appendRound) float64 { return get(r).pgPer100k() }, "%.2f")
		return fmt.Sprintf("CPU-s per 100k: %.2f (rounds: %s); PostgreSQL %.2f (rounds: %s)", v, rs, pv, prs)
	}
	rat := func(r appendRound) pgRun { return r.ratchet }
	dir := func(r appendRound) pgRun { return r.direct }
	rs, v := series(func(r appendRound) float64 { return r.ratchet.Rate() }, "%.0f")
	row(fmt.Sprintf(l+" exactly-once append pipeline (COPY), %d JSON orders", s.orders), fmt.Sprintf("%.0f records/s (rounds: %s); ratchet %s", v, rs, cpu(rat)), "", "")
	rs, v = series(func(r appendRound) float64 { return r.direct.Rate() }, "%.0f")
	row(l+" direct pgx CopyFrom loop, the same rows, connections and rows per transaction", fmt.Sprintf("%.0f records/s (rounds: %s); loop %s", v, rs, cpu(dir)), "", "")
	rs, v = series(func(r appendRound) float64 { return r.ratchet.Rate() / r.direct.Rate() }, "%.2f")
	row(l+" append pipeline / direct CopyFrom", fmt.Sprintf("%.2f (rounds: %s)", v, rs), "≥ 0.8", passMiss(v >= 0.8))
	if s.pinned {
		return
	}
	// What the machine leaves: a consumer of this client that reads these
	// records cannot append them faster than it reads them, nor take less
	// CPU per record than reading them takes.
	rs, v = series(func(r appendRound) float64 { return r.poll.Rate() }, "%.0f")
	_, own := series(func(r appendRound) float64 { return r.poll.ratchetPer100k() }, "%.2f")
	row("(j2) bare Poll loop reading the same records and decoding status and amount (valyala/fastjson), writing nothing",
		fmt.Sprintf("%.0f records/s (rounds: %s); loop CPU-s per 100k: %.2f", v, rs, own), "", "")
	rs, v = series(func(r appendRound) float64 { return r.poll.Rate() / r.direct.Rate() }, "%.2f")
	row("(j2) bare Poll loop / direct CopyFrom: reading alone, with both cores to itself, against the direct loop's rate",
		fmt.Sprintf("%.2f (rounds: %s)", v, rs), "reported", "")
	rs, v = series(func(r appendRound) float64 { return cpuBudget(runtime.NumCPU(), r.ratchet, r.direct) }, "%.2f")
	_, ratCPU := series(func(r appendRound) float64 { return r.ratchet.ratchetPer100k() }, "%.2f")
	row(fmt.Sprintf("(j2) CPU-s per 100k the append pipeline may take to reach 0.8 of the direct CopyFrom on %d busy cores (cores at that rate, less PostgreSQL's and the broker's in its runs)", runtime.NumCPU()),
		fmt.Sprintf("%.2f (rounds: %s); the bare Poll loop's own %.2f; ratchet %.2f", v, rs, own, ratCPU), "reported", "")
}

// method says how the section is measured.
func (s *appendReport) method() string {
	if s == nil || len(s.rounds) == 0 {
		return ""
	}
	if s.pinned {
		return fmt.Sprintf("- (j2) pinned: the same %d pairs of drains once more with PostgreSQL pinned to CPU 0 and this process and the broker to the other CPUs, as (l) pinned, without the Poll loop: PostgreSQL has the same CPU in the pipeline's runs as in the direct loop's, as with the engine on a machine of its own.\n", len(s.rounds))
	}
	return fmt.Sprintf("- Append (j2): %d rounds, each an exactly-once drain (fresh group, records/s from the first record applied to the last; CPU-seconds per 100,000 records of this process, the engine's or the loop's, and of the bench database's PostgreSQL backends, measured as in (l)) of the %d JSON orders of `orders-json` by an append pipeline of seven columns (partition, offset, key, status, customer, amount, timestamp) into `%s`, and a direct loop writing the same rows (read back from the first drain) with pgx `CopyFrom`: one writer per partition (12), a pool of the engine's default size, the engine's rows per transaction (`processing.batch_size`), each batch in its own transaction; the order alternates between rounds, the row count is checked after each, and the median is reported. The direct loop reads no Kafka and evaluates no CEL: the ratio is what the pipeline costs over the COPY alone. After each pair, a bare confluent-kafka-go Poll loop (as in (l): ratchet's consumer settings, all 12 partitions assigned, no commits) reads the same records and decodes `status` and `amount` with valyala/fastjson, writing nothing: where its rate is below 0.8 of the direct loop's, or its CPU per record above what the cores leave the pipeline at 0.8 of that rate (less PostgreSQL's and the broker's in the pipeline's runs, as in (l)'s budget rows), no consumer of this client meets the target on this machine. Before each timed run that writes, a `CHECKPOINT` writes out what earlier runs left dirty, so no run pays for another's pages or meets a checkpoint that max_wal_size sets off.\n",
		len(s.rounds), s.orders, appendTable)
}
